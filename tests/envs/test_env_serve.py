"""``serve`` end to end: a real broker, the fake inference server, the example env's CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from envs_testlib import HERE, Process, child_env, env_command, pull_batches, register_trainer


@pytest.mark.slow
def test_serve_delivers_groups_and_stops_at_total_steps(
    broker: Process, fake: Process, tmp_path: Path
) -> None:
    register_trainer(broker.url, batch_size=8)
    log = (tmp_path / "env.log").open("wb")
    env = subprocess.Popen(
        env_command(
            "serve",
            f"--env.rollout_server_url={broker.url}",
            f"--openai.base_url={fake.url}/v1",
            "--env.total_steps=3",
            "--env.steps_per_eval=2",
            f"--env.data_dir_to_save_evals={tmp_path / 'evals'}",
        ),
        env=child_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        batches = pull_batches(broker.url, 3, timeout=120)
        assert env.wait(timeout=60) == 0, (tmp_path / "env.log").read_text()[-3000:]
    finally:
        env.kill()
    groups = [group for batch in batches for group in batch]
    assert len(groups) == 6
    for group in groups:
        assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == 4
        assert group["env_id"] == 0
        assert sorted(group["scores"]) == [0.0, 0.0, 0.0, 1.0]
        assert group["group_id"] and group["policy_version"] is not None
        assert group["messages"][0][-1]["role"] == "assistant"
    assert len({group["group_id"] for group in groups}) == 6
    # evaluate() ran at step 2 and wrote its metrics
    assert (tmp_path / "evals" / "metrics.json").exists()


@pytest.mark.slow
def test_serve_writes_groups_without_signal_to_its_file_as_dropped_and_never_sends_them(
    broker: Process, fake: Process, tmp_path: Path
) -> None:
    """``ensure_scores_are_not_same``: a group whose scores are all equal is not sent, yet the
    group file holds it (marked ``dropped`` with the reason), so the file has every sample."""
    register_trainer(broker.url, batch_size=8)
    dump = tmp_path / "groups.jsonl"
    env = subprocess.Popen(
        env_command(
            "serve",
            f"--env.rollout_server_url={broker.url}",
            f"--openai.base_url={fake.url}/v1",
            "--env.total_steps=3",
            "--env.ensure_scores_are_not_same=true",
            f"--env.data_path_to_save_groups={dump}",
            script=HERE / "half_signal_env.py",  # half the items have no right reply
        ),
        env=child_env(),
        stdout=(tmp_path / "env.log").open("wb"),
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    try:
        batches = pull_batches(broker.url, 3, timeout=120)
        assert env.wait(timeout=60) == 0, (tmp_path / "env.log").read_text()[-3000:]
    finally:
        env.kill()
    trained = {group["group_id"] for batch in batches for group in batch}
    rows = [json.loads(line) for line in dump.read_text().splitlines()]
    dropped = [row for row in rows if "dropped" in row]
    sent = [row for row in rows if "dropped" not in row]
    assert dropped, "no item drew an answer beyond the replies: the check ran on nothing"
    for row in dropped:
        assert row["scores"] == [0.0] * 4 and "no learning signal" in row["dropped"]
        assert row.get("group_id") is None and row["policy_version"] is not None
        assert len(row["tokens"]) == len(row["messages"]) == 4
    assert {row["group_id"] for row in sent} >= trained
    assert all(sorted(row["scores"]) == [0.0, 0.0, 0.0, 1.0] for row in sent)
