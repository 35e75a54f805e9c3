"""``serve`` against the real broker: groups whose size differs from the registered one
(one-sequence SFT rows, rlaif pairs) reach the trainer intact."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from envcat_testlib import BrokerServer, serve_env

pytestmark = pytest.mark.slow


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerServer]:
    server = BrokerServer(tmp_path)
    yield server
    server.stop()


def test_sft_rows_then_rlaif_pairs_travel_through_the_broker(
    scripted, broker: BrokerServer, tmp_path: Path
) -> None:
    broker.register_trainer(batch_size=4)
    server = scripted([
        {"when": "Response A:\nGood answer", "replies": ["<verdict>A</verdict>"]},
        {"when": "Response A:\nBad answer", "replies": ["<verdict>B</verdict>"]},
        {"when": "", "replies": ["Good answer", "Bad answer"]},
    ])  # fmt: skip
    data = tmp_path / "sft.jsonl"
    rows = [{"prompt": f"q{i}", "completion": f"a{i}"} for i in range(4)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    batches = []
    for name, flags in (  # total_steps counts the broker's steps: 1 batch each
        ("sft_loader", [f"--env.data_path={data}", "--env.total_steps=1"]),
        ("rlaif", ["--env.group_size=4", "--env.total_steps=2"]),
    ):
        env = serve_env(name, server, broker, tmp_path, *flags)
        try:
            batches += broker.pull_batches(1, env)
        finally:
            env.kill()
            env.wait(timeout=10)
        assert len(batches) == 1 + (name == "rlaif"), (tmp_path / f"serve-{name}.log").read_text()
    sft_batch, rlaif_batch = batches
    assert len(sft_batch) == 4
    for group in sft_batch:
        assert group["group_overrides"] == {"sft": True, "group_size": 1}
        assert len(group["tokens"]) == 1 and group["scores"] == [1.0]
    assert len(rlaif_batch) == 2
    for group in rlaif_batch:
        assert group["group_overrides"] == {"group_size": 2}
        assert group["scores"] == [1.0, -1.0]
