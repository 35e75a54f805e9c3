"""In-process tests of BaseEnv, the runner's budget, checkpoints, the spool and SLURM discovery."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataItem
from atroposlib.envs.runner import EnvRunner
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
from atroposlib.envs.server_handling.slurm import resolve_server_configs
from atroposlib.envs.spool import Spool
from atroposlib.errors import ConfigError
from atroposlib.wire.broker import EnvStatusResponse
from tests.fakes import CharTokenizer


class ItemEnv(BaseEnv):
    """collect_trajectory returns whatever ``self.next_rollouts`` says."""

    name = "units"

    async def get_next_item(self) -> Any:
        return 1

    async def collect_trajectory(self, item: Any) -> tuple[ScoredDataItem | None, list[Any]]:
        rollout = self.next_rollouts.pop(0)
        return rollout, ["extra"] if rollout is None else []


def make_env(**config: Any) -> ItemEnv:
    env = ItemEnv(
        BaseEnvConfig(use_wandb=False, group_size=2, **config), ServerBaseline(), testing=True
    )
    env.next_rollouts = []
    return env


def rollout(length: int, score: float, mask_length: int | None = None) -> ScoredDataItem:
    tokens = list(range(1, length + 1))
    masks = [-100, *tokens[1 : (mask_length or length)]]
    return {"tokens": tokens, "masks": masks, "scores": score}


async def test_a_group_with_mismatched_lengths_is_not_sent_and_the_reason_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = make_env()
    env.next_rollouts = [rollout(4, 1.0), rollout(4, 0.0, mask_length=3)]
    with caplog.at_level(logging.WARNING, logger="atroposlib.envs.base"):
        assert await env.run_item(1) == []
    assert "masks[1] has 3 values but tokens[1] has 4" in caplog.text
    assert sum(env.perf.rejected.values()) == 1


async def test_rollouts_are_stacked_into_a_group_and_checked() -> None:
    env = make_env(max_token_length=16)
    env.next_rollouts = [rollout(4, 1.0), rollout(5, 0.0)]
    [group] = await env.run_item(1)
    assert group["scores"] == [1.0, 0.0] and [len(t) for t in group["tokens"]] == [4, 5]
    env.next_rollouts = [rollout(4, 1.0), rollout(4, 1.0)]
    assert await env.run_item(1) == [], "identical scores are dropped"
    env.next_rollouts = [rollout(4, 1.0), None]
    assert await env.run_item(1) == [], "a group short of group_size is dropped"
    assert env.backlog == ["extra"], "backlog items returned by collect_trajectory are kept"


async def test_a_group_over_the_token_budget_goes_to_the_dump_with_its_reason_and_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = make_env()
    env.max_token_len = 8  # the trainer's budget, as the broker's registration answers it
    env.next_rollouts = [rollout(4, 1.0), rollout(9, 0.0)]
    dropped: list[dict[str, Any]] = []
    with caplog.at_level(logging.WARNING, logger="atroposlib.envs.base"):
        assert await env.run_item(1, dropped=dropped) == []
    [group] = dropped
    assert group["dropped"] == "a sequence has 9 tokens, over max_token_len 8"
    assert [len(tokens) for tokens in group["tokens"]] == [4, 9]
    assert "group not sent: a sequence has 9 tokens" in caplog.text
    env.next_rollouts = [rollout(4, 1.0), rollout(4, 1.0, mask_length=3)]  # malformed
    assert await env.run_item(1, dropped=dropped) == [] and len(dropped) == 1


class NoClient:
    async def post_groups(self, groups: Any) -> None:
        raise AssertionError("not used")


def status(queue: int = 0, step: int = 0, self_queue: int = 0) -> EnvStatusResponse:
    return EnvStatusResponse(
        current_step=step,
        queue_size=queue,
        unallocated_fraction=1.0,
        self_queue_size=self_queue,
        max_group_size=2,
        env_weight=1.0,
    )


@pytest.fixture
def runner(tmp_path: Path) -> EnvRunner:
    env = make_env(batch_size=8, max_num_workers=6, max_batches_offpolicy=2, total_steps=100)
    return EnvRunner(env, NoClient(), spool_path=tmp_path / "spool.jsonl")  # type: ignore[arg-type]


async def test_the_budget_follows_the_off_policy_limit(runner: EnvRunner) -> None:
    assert runner.worker_budget(status(queue=0)) == 6, "capped by max_num_workers"
    assert runner.worker_budget(status(queue=5)) == 3, "2 batches x 8 / group of 2 = 8 groups"
    assert runner.worker_budget(status(queue=8)) == 0
    assert runner.worker_budget(status(queue=0, step=100)) == 0, "total_steps reached"
    runner.env.config.min_batch_allocation = 0.5
    assert runner.worker_budget(status(queue=8, self_queue=1)) == 3, "own minimum share refilled"


async def test_when_most_rollouts_send_nothing_more_of_them_run(runner: EnvRunner) -> None:
    """The limit is on groups sent: with a quarter of rollouts sending a group (the others
    dropped as all-equal), up to four times as many run as there is room in the broker."""
    runner.env.config.max_num_workers = runner.env.max_num_workers = 64
    runner.outcomes.extend([True] * 7)
    assert runner.worker_budget(status(queue=5)) == 3, "a few rollouts tell nothing yet"
    runner.outcomes.extend([False] * 21)  # 7 of 28 sent a group
    assert runner.sent_share() == 0.25
    assert runner.worker_budget(status(queue=5)) == 12  # room for 3 groups sent
    assert runner.worker_budget(status(queue=8)) == 0  # the broker holds enough
    runner.outcomes.extend([False] * 64)  # none sent lately: at most four times
    assert runner.sent_share() == 0.25
    runner.env.config.max_num_workers = runner.env.max_num_workers = 8
    assert runner.worker_budget(status(queue=0)) == 8, "still capped by max_num_workers"


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (EvalHandlingEnum.STOP_TRAIN, 0),
        (EvalHandlingEnum.LIMIT_TRAIN, 3),
        (EvalHandlingEnum.NONE, 6),
    ],
)
async def test_eval_handling_modes_limit_training_during_an_eval(
    runner: EnvRunner, mode: EvalHandlingEnum, expected: int
) -> None:
    import asyncio

    runner.env.config.eval_handling = mode
    runner.eval_task = asyncio.create_task(asyncio.sleep(10))
    try:
        assert runner.worker_budget(status()) == expected
    finally:
        runner.eval_task.cancel()


def test_checkpoints_round_trip(tmp_path: Path) -> None:
    env = make_env()
    env.checkpoint_dir, env.wandb_prepend = str(tmp_path), "units_0"
    env.save_checkpoint(10, {"epoch": 3, "seen": [1, 2]})
    env.save_checkpoint(20, {"epoch": 4, "seen": [1, 2, 3]})
    env.curr_step = 25
    env.load_checkpoint()
    assert env.epoch == 4 and env.seen == [1, 2, 3]  # type: ignore[attr-defined]
    assert (tmp_path / "env_checkpoints" / "units_0" / "step-10.json").exists()


def test_the_spool_survives_a_crash_and_empties_when_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "spool.jsonl"
    spool = Spool(path)
    spool.add([{"group_id": "a", "scores": [1]}, {"group_id": "b", "scores": [2]}])
    spool.ack(["a"])
    spool.close()
    with path.open("ab") as handle:
        handle.write(orjson.dumps({"add": {"group_id": "c"}})[:-3])  # torn last line
    again = Spool(path)
    assert [g["group_id"] for g in again.oldest(10)] == ["b"]
    again.ack(["b"])
    assert len(again) == 0 and path.stat().st_size == 0
    again.close()


def test_slurm_discovery_for_any_tensor_parallel_size() -> None:
    template = [APIServerConfig(base_url="http://ignored/v1", model_name="m")]
    env = {"SLURM_JOB_NODELIST": "gpu[01-03]", "NUM_TRAINING_NODES": "1", "GPUS_PER_NODE": "8"}
    urls = [c.base_url for c in resolve_server_configs(template, slurm=True, environ=env)]
    assert (
        len(urls) == 16 and urls[0] == "http://gpu02:9000/v1" and urls[-1] == "http://gpu03:9007/v1"
    )
    tp2 = resolve_server_configs(template, slurm=True, environ={**env, "INFER_TP": "2"})
    assert [c.base_url for c in tp2][:5] == [
        "http://gpu02:9000/v1", "http://gpu02:9001/v1", "http://gpu02:9002/v1",
        "http://gpu02:9003/v1", "http://gpu03:9000/v1",
    ]  # fmt: skip
    wide = {**env, "SLURM_JOB_NODELIST": "n[1-5]", "INFER_TP": "16"}
    assert [c.base_url for c in resolve_server_configs(template, slurm=True, environ=wide)] == [
        "http://n2:9000/v1",
        "http://n4:9000/v1",
    ]
    assert all(c.model_name == "m" for c in tp2)
    assert [c.base_url for c in resolve_server_configs(template, slurm=False, environ=env)] == [
        "http://ignored/v1"
    ], "without --slurm the configured server is used"
    local = resolve_server_configs(ServerBaseline(), slurm=False, environ={})
    assert [c.base_url for c in local] == [f"http://localhost:{p}/v1" for p in range(9004, 9008)]
    with pytest.raises(ConfigError, match="no node is left for inference"):
        resolve_server_configs(template, slurm=True, environ={**env, "NUM_TRAINING_NODES": "3"})


async def test_wandb_log_prefixes_metrics_with_the_env_name() -> None:
    logged: list[tuple[dict[str, Any], int | None]] = []

    class Recorder:
        def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
            logged.append((metrics, step))

        def table(self, columns: list[str], rows: list[list[Any]]) -> Any:
            return {"columns": columns, "rows": rows}

        def finish(self) -> None:
            return None

    env = make_env()
    env.tracker = Recorder()
    env.wandb_prepend, env.curr_step = "units_0", 7
    env.next_rollouts = [rollout(4, 1.0), rollout(6, 0.0)]
    await env.run_item(1)
    await env.wandb_log({"custom": 1.5})
    metrics, step = logged[-1]
    assert step == 7
    assert metrics["units_0/custom"] == 1.5
    assert metrics["units_0/train/completion_lengths_mean"] == 4.0
    assert metrics["units_0/train/scores_mean"] == 0.5
    assert metrics["units_0/train/rollouts"]["columns"] == ["text", "score"]
    assert metrics["units_0/perf/tasks_succeeded"] == 1.0
    assert any(key.startswith("server/server_0") for key in metrics)


def test_no_wandb_is_a_null_tracker_and_offline_wandb_needs_no_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from atroposlib.envs.tracking import NullTracker, WandbTracker, make_tracker

    assert isinstance(
        make_tracker(False, project=None, group=None, name=None, config={}), NullTracker
    )
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = make_tracker(True, project="p", group="g", name="units_0", config={"a": 1})
    assert isinstance(tracker, WandbTracker)
    tracker.log({"units_0/x": 1.0}, step=1)
    tracker.finish()
    assert list(tmp_path.glob("wandb/offline-run-*"))


def test_wandb_without_an_api_key_warns_and_logs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``process`` turns use_wandb on as Atropos did; with no key it still runs, saying how."""
    import wandb

    from atroposlib.envs.tracking import NullTracker, make_tracker

    wandb.teardown()  # settings read by an earlier test (WANDB_MODE=offline) are forgotten
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    with open(os.devnull) as no_terminal:  # nobody to ask for a key
        monkeypatch.setattr("sys.stdin", no_terminal)
        tracker = make_tracker(True, project="p", group=None, name="n", config={})
    wandb.teardown()
    assert isinstance(tracker, NullTracker)
    assert "--env.use_wandb false" in caplog.text


async def test_steps_trigger_evals_and_checkpoints(runner: EnvRunner) -> None:
    import asyncio

    env = runner.env
    saved: list[int] = []
    evaluated: list[int] = []

    async def evaluate(*args: Any, **kwargs: Any) -> None:
        evaluated.append(env.curr_step)

    env.save_checkpoint = lambda step, data=None: saved.append(step)  # type: ignore[method-assign]
    env.evaluate = evaluate  # type: ignore[method-assign]
    env.checkpoint_interval, env.config.steps_per_eval = 3, 2
    for step in (1, 2, 4, 7):
        await runner._on_step(step)
        if runner.eval_task is not None:
            await runner.eval_task
    await asyncio.sleep(0)
    assert evaluated == [2, 4, 7], "steps 2, 4 and 6 (seen at 7) cross an eval boundary"
    assert saved == [3, 6], "checkpoints at the interval boundaries crossed"


async def test_a_stuck_rollout_is_cancelled_after_worker_timeout(runner: EnvRunner) -> None:
    import asyncio

    async def stuck(item: Any) -> Any:
        await asyncio.sleep(3600)

    runner.env.collect_trajectories = stuck  # type: ignore[method-assign]
    runner.env.config.worker_timeout = 5
    runner._spawn("item", 0)
    [rollout] = runner.rollouts.values()
    rollout.started -= 10
    runner._cancel_timed_out()
    await asyncio.sleep(0)
    assert not runner.rollouts and rollout.task.cancelled()
    assert runner.env.perf.failed == 1


async def test_testing_mode_needs_no_inference_server(tmp_path: Path) -> None:
    from example_env import AdditionEnv

    from atroposlib.envs import modes
    from atroposlib.envs.cli import build_env, parse_settings

    out = tmp_path / "groups.jsonl"
    argv = ["--testing", f"--env.data_path_to_save_groups={out}", "--env.total_steps=2"]
    env = build_env(AdditionEnv, parse_settings(AdditionEnv, "process", argv, environ={}))
    env.tokenizer = CharTokenizer()
    groups = await modes.process(env)
    assert len(groups) == 2 and out.exists() and out.with_suffix(".html").exists()
    assert groups[0]["messages"][0][-1]["content"] == "test response 0"


def test_token_sampler_defaults_work_on_a_plain_base_config() -> None:
    env = make_env(max_token_length=64)
    env.tokenizer = CharTokenizer()
    sampler = env.token_sampler()
    assert (sampler.max_tokens, sampler.max_token_length, sampler.temperature) == (64, 64, 1.0)
    capped = env.token_sampler(max_tokens=8, temperature=0.5)
    assert (capped.max_tokens, capped.max_token_length, capped.temperature) == (8, None, 0.5)


async def test_each_finished_rollout_records_whether_it_sent_a_group(runner: EnvRunner) -> None:
    env = runner.env
    env.next_rollouts = [rollout(4, 1.0), rollout(4, 1.0)]  # all equal: dropped
    await runner._rollout("a", 1, 0)
    env.next_rollouts = [rollout(4, 1.0), rollout(4, 0.0)]
    await runner._rollout("b", 2, 0)
    assert list(runner.outcomes) == [False, True]
    assert runner.sender.backlog == 1  # the one group sent is on its way
