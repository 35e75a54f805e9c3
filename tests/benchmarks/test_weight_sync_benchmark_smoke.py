"""The weight-sync benchmark's load, one sync per way, against this checkout's server.

No timing is asserted; the figures come from ``benchmarks/weight_sync.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.weight_sync import main

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_one_sync_per_way_prints_the_table(
    test_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a second between pushes: under a loaded CI machine a 0.3 s gap once let no 8-token
    # request finish in the keep run (0 tok/s), which is not what this checks
    argv = ["--model", str(test_model_path), "--syncs", "1", "--gap", "1.0", "--clients", "2"]
    assert main([*argv, "--ways", "disk,keep,abort", "--tokens", "8"]) == 0
    table = capsys.readouterr().out.splitlines()[-4:]
    assert [line.split()[0] for line in table] == ["way", "disk", "keep", "abort"]
    disk, keep = (line.split() for line in table[1:3])
    assert float(disk[1]) > 0 and float(keep[1]) > 0 and float(keep[5]) > 0  # blocked, tok/s
