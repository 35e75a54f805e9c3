"""The session-pinning benchmark on two real embedded servers, tiny shapes: a pinned
``managed_server()`` session prefills each later turn on the server that computed the turns
before it (its prompt continues a kept beginning), and nothing moves. No timing is asserted;
the figures come from ``benchmarks/session_pinning.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.model]

ROOT = Path(__file__).resolve().parents[2]


def test_pinned_turns_reuse_the_conversation_their_server_already_computed(
    test_model_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "pinning.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/session_pinning.py"), "--sessions", "2",
         "--turns", "3", "--max-tokens", "8", "--model", str(test_model_path), "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    body = json.loads(out.read_text())
    pinned = [row for row in body["rows"] if row["mode"] == "pinned"]
    unpinned = [row for row in body["rows"] if row["mode"] == "unpinned"]
    assert [row["turn"] for row in pinned] == [row["turn"] for row in unpinned] == [1, 2, 3]
    assert pinned[-1]["moves"] == 0 and sum(pinned[-1]["sessions_per_server"]) == 2
    # each pinned session's prompts go to one server only: the servers' prompt tokens of a
    # later turn are zero on a server that holds no session
    idle = [i for i, count in enumerate(pinned[-1]["sessions_per_server"]) if count == 0]
    for row in pinned[1:]:
        assert row["hit_share"] > 0.5, row  # the previous turn's prompt was not run again
        assert all(row["prompt_tokens_per_server"][i] == 0 for i in idle), row
    assert pinned[0]["prompt_tokens"] > 0 and body["summary"]["hit_share"]["pinned"] > 0.5
    assert "prefill_ratio_unpinned_over_pinned" in body["summary"]
