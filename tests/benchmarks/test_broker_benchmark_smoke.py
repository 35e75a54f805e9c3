"""The broker benchmark's load, tiny shapes, against our broker only: every sequence exactly once.

No timing is asserted; the figures come from ``benchmarks/broker_throughput.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.broker_throughput import Shape, backlog_row, run_load, start_server

# Each case starts a broker and two spawned client processes: ~8 s apiece, ~40 s in all.
pytestmark = pytest.mark.slow

TINY = Shape(envs=2, group_size=4, seq_len=64, batch_size=8, groups_per_env=6)
# Three envs, odd group size: a batch takes groups from several envs.
ODD = Shape(envs=3, group_size=3, seq_len=32, batch_size=9, groups_per_env=5)


@pytest.mark.parametrize(
    ("store", "encoding", "shape"),
    [
        ("ours-sqlite", "json", TINY),
        ("ours-sqlite", "msgpack", TINY),
        ("ours-memory", "json", ODD),
        ("ours-memory", "msgpack", TINY),
    ],
)
def test_load_delivers_every_sequence_once(
    tmp_path: Path, store: str, encoding: str, shape: Shape
) -> None:
    server = start_server(store, tmp_path)
    try:
        result = run_load(server.base_url, shape, encoding, drain_seconds=2.0)
    finally:
        server.stop()
    assert result.post_errors == 0
    assert (result.lost, result.duplicated, result.corrupt) == (0, 0, 0)
    assert result.sequences_delivered == shape.total_sequences
    assert result.tokens_delivered == shape.total_sequences * shape.seq_len
    assert len(result.post_latencies_ms) == shape.envs * shape.groups_per_env
    assert len(result.get_latencies_ms) == shape.total_sequences // shape.batch_size


def test_backlog_counts_every_queued_group(tmp_path: Path) -> None:
    row = backlog_row("ours-memory", TINY, tmp_path)
    # One warm-up group plus every group of the shape, none pulled.
    assert row["queued_groups_reported"] == TINY.envs * TINY.groups_per_env + 1
    assert row["queued_tokens"] == TINY.total_sequences * TINY.seq_len
