"""The env-overhead benchmark's token-vs-text comparison runs, tiny: both paths deliver groups.

No timing is asserted; the figures come from ``benchmarks/env_overhead.py --compare paths``.
"""

from __future__ import annotations

import pytest

from benchmarks.env_overhead import run_one

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("path", ["text", "token"])
def test_each_path_delivers_batches_of_groups(path: str) -> None:
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    result = run_one(f"smoke-{path}", sys.executable, root, 2, 1, script="sampling_env.py",
                     extra_env={"BENCH_PATH": path}, reply_words=8)  # fmt: skip
    assert result["groups"] >= 2 * 64 // 8
