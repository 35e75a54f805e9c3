"""The prefix_shared collation benchmark, this checkout against itself on the demo's shape.

No timing is asserted; the figures come from ``benchmarks/tree_mask.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.tree_mask import main

ROOT = Path(__file__).resolve().parents[2]


def test_both_trees_lay_the_same_batch_and_the_ratio_is_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--shape", "demo", "--repeat", "1", "--baseline-tree", str(ROOT)]
    assert main(argv) == 0
    baseline, this, ratio = capsys.readouterr().out.splitlines()[-3:]
    assert baseline.startswith("demo baseline: collation ") and this.startswith("demo this: ")
    assert baseline.split("s a step")[1] == this.split("s a step")[1]  # same rows, tokens, mask
    assert "1,600 tokens laid" in this and float(ratio.split()[-1].rstrip("x")) > 0
