"""``serve`` end to end: a real broker, the fake inference server, the example env's CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from envs_testlib import Process, child_env, env_command, pull_batches, register_trainer


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
