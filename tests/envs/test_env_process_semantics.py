"""``process`` keeps going past failing items within its budget, skips malformed groups, writes
Atropos's keys, and exits non-zero with one line when it could write nothing."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from envs_testlib import child_env

from atroposlib.envs import modes
from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.tracking import NullTracker

ATROPOS_KEYS = {
    "tokens",
    "masks",
    "scores",
    "ref_logprobs",
    "overrides",
    "group_overrides",
    "distill_token_ids",
    "distill_logprobs",
}
"""What Atropos 0.4 wrote for a group an env built itself without messages (include_messages
off): its keys and these, null when the env set none."""


def good_group(seed: int) -> ScoredDataGroup:
    return {
        "tokens": [[1, seed], [1, seed + 1]],
        "masks": [[-100, seed], [-100, seed + 1]],
        "scores": [1.0, 0.0],
    }


class ScriptedEnv(BaseEnv):
    """Items 0..n; ``plan[item]`` is a list of outcomes, one per attempt (last one repeats)."""

    name = "scripted"

    def __init__(self, config: BaseEnvConfig, plan: dict[int, list[Any]], items: int) -> None:
        super().__init__(config, [], testing=True)
        self.plan, self.items, self.calls = plan, items, []
        self.next = 0

    async def get_next_item(self) -> Any:
        if self.next >= self.items:
            return None
        self.next += 1
        return {"id": self.next - 1}

    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        key = item["id"]
        self.calls.append(key)
        outcomes = self.plan.get(key, ["good"])
        outcome = outcomes[min(self.calls.count(key) - 1, len(outcomes) - 1)]
        if outcome == "raise":
            raise RuntimeError(f"env bug on item {key}")
        if outcome == "good":
            return good_group(10 * key), []
        return outcome, []


def make_env(
    tmp_path: Path, plan: dict[int, list[Any]], items: int, total: int, **settings: Any
) -> ScriptedEnv:
    config = BaseEnvConfig(
        **{
            "group_size": 2,
            "total_steps": total,
            "use_wandb": False,
            "ensure_scores_are_not_same": False,
            "max_num_workers": 2,
            "data_path_to_save_groups": str(tmp_path / "groups.jsonl"),
            **settings,
        }
    )
    return ScriptedEnv(config, plan, items)


def rows(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]


async def test_failing_items_are_retried_then_given_up_and_the_run_still_reaches_total_steps(
    tmp_path: Path,
) -> None:
    plan = {0: ["raise", "good"], 1: ["raise"], 2: [None, None, "good"]}
    env = make_env(tmp_path, plan, items=10, total=4)
    written = await modes.process(env)
    assert len(written) == 4 and len(rows(tmp_path)) == 4
    assert env.calls.count(0) == 2 and env.calls.count(2) == 3
    assert env.calls.count(1) == modes.ATTEMPTS_PER_ITEM  # given up, not retried forever
    assert sorted(r["tokens"][0][1] for r in rows(tmp_path)) == [0, 20, 30, 40]


async def test_malformed_groups_are_logged_with_their_item_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    malformed = [
        "not a group",
        {"tokens": "x", "masks": [], "scores": []},
        {"tokens": [[1], 7], "masks": [[1], [1]], "scores": [0.0, 1.0]},
        good_group(5),
    ]
    env = make_env(tmp_path, {0: [malformed]}, items=1, total=1)
    with caplog.at_level(logging.WARNING):
        await modes.process(env)
    assert [r["tokens"] for r in rows(tmp_path)] == [good_group(5)["tokens"]]
    rejected = [r.getMessage() for r in caplog.records if "group not sent" in r.getMessage()]
    assert len(rejected) == 3 and all("malformed group" in m and "'id': 0" in m for m in rejected)


async def test_process_writes_groups_with_nothing_to_train_as_atropos_did(tmp_path: Path) -> None:
    untrainable = {"tokens": [[1, 2], [1, 3]], "masks": [[-100, -100], [-100, -100]],
                   "scores": [0.0, 1.0]}  # fmt: skip
    env = make_env(tmp_path, {0: [untrainable]}, items=1, total=1)
    await modes.process(env)
    assert rows(tmp_path)[0]["masks"] == untrainable["masks"]
    assert env.accept_groups(untrainable) == []  # serve still refuses to send it


async def test_rows_carry_atropos_keys_with_nulls(tmp_path: Path) -> None:
    env = make_env(tmp_path, {}, items=3, total=2)
    await modes.process(env)
    for row in rows(tmp_path):
        assert set(row) == ATROPOS_KEYS
        assert row["ref_logprobs"] is None and row["distill_logprobs"] is None


class CountingEnv(ScriptedEnv):
    """Records each ``wandb_log`` call, as an env that logs its own metrics would."""

    logged: list[dict[str, Any] | None]

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        self.logged = [*getattr(self, "logged", []), wandb_metrics]
        await super().wandb_log(wandb_metrics)


async def test_wandb_log_runs_once_per_written_group_and_wandb_off_stays_off(
    tmp_path: Path,
) -> None:
    config = make_env(tmp_path, {}, items=5, total=3).config
    env = CountingEnv(config, {}, items=5)
    await modes.process(env)
    assert len(rows(tmp_path)) == 3 and env.logged == [None, None, None]
    assert isinstance(env.tracker, NullTracker), "use_wandb false: no wandb run, no network"
    assert env.curr_step == 3


def test_process_and_evaluate_turn_use_wandb_on_as_atropos_unless_told_not_to() -> None:
    for command in ("process", "evaluate"):
        assert modes.MODES[command].defaults(ScriptedEnv)["use_wandb"] is True


NO_GROUP = [None]


async def test_a_rarely_forming_group_is_waited_for_past_many_given_up_items(
    tmp_path: Path,
) -> None:
    plan = {key: NO_GROUP for key in range(60)}  # item 60 is the first to form a group
    env = make_env(tmp_path, plan, items=1000, total=1, max_num_workers=1)
    written = await modes.process(env)
    assert len(written) == 1 and rows(tmp_path)[0]["tokens"] == good_group(600)["tokens"]
    assert len(env.calls) == 60 * modes.ATTEMPTS_PER_ITEM + 1  # 181 rollouts, none wasted


async def test_rollouts_that_give_no_group_widen_to_every_worker(tmp_path: Path) -> None:
    class CountingEnv(ScriptedEnv):
        running, peaks = 0, []

        async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
            self.running += 1
            self.peaks.append(self.running)
            await asyncio.sleep(0.01)
            self.running -= 1
            return await super().collect_trajectories(item)

    config = make_env(tmp_path, {}, items=1, total=1, max_num_workers=4).config
    env = CountingEnv(config, {key: NO_GROUP for key in range(3)}, items=100)
    assert len(await modes.process(env)) == 1
    assert env.peaks[0] == 1 and max(env.peaks) == 4  # one while groups come, then all four


async def test_the_rollout_budget_stops_process_with_the_flag_to_raise(tmp_path: Path) -> None:
    env = make_env(tmp_path, {}, items=1000, total=3, process_max_attempts_without_group=7)
    env.plan = {key: NO_GROUP for key in range(1000)}
    with pytest.raises(modes.ProcessFailedError) as failed:
        await modes.process(env)
    assert len(env.calls) == 7  # batches of 2 never overshoot the budget
    assert str(failed.value) == (
        "process wrote no group: 7 rollouts in a row wrote no group "
        "(--env.process_max_attempts_without_group 7; raise it to keep trying); "
        "7 rollouts of 3 items; last failure: collect_trajectories gave no group"
    )
    assert not (tmp_path / "groups.jsonl").exists()


async def test_a_written_group_renews_the_budget(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plan = {0: NO_GROUP, 1: [None, "good"], 2: NO_GROUP, 3: NO_GROUP}
    env = make_env(tmp_path, plan, items=4, total=3, max_num_workers=1,
                   process_max_attempts_without_group=5)  # fmt: skip
    with caplog.at_level(logging.WARNING):
        written = await modes.process(env)
    assert len(written) == 1
    assert env.calls == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]  # 4 misses, a group, then 5 misses
    assert "only 1 of 3 groups were written: 5 rollouts in a row wrote no group" in caplog.text


async def test_the_minutes_budget_uses_the_clock(tmp_path: Path) -> None:
    now = [0.0]

    class SlowEnv(ScriptedEnv):
        async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
            now[0] += 25.0  # each rollout takes 25 s
            return await super().collect_trajectories(item)

    config = make_env(tmp_path, {}, items=1, total=1).config.model_copy(
        update={"process_max_minutes_without_group": 1.5, "max_num_workers": 1}
    )
    env = SlowEnv(config, {key: NO_GROUP for key in range(100)}, items=100)
    with pytest.raises(modes.ProcessFailedError, match=r"1\.7 minutes without a written group "
                       r"\(--env\.process_max_minutes_without_group 1\.5; raise it"):  # fmt: skip
        await modes.process(env, clock=lambda: now[0])
    assert len(env.calls) == 4  # 100 s > 90 s after the 4th


async def test_an_env_that_raises_every_time_stops_early_whatever_the_budget(
    tmp_path: Path,
) -> None:
    env = make_env(tmp_path, {}, items=1000, total=1, max_num_workers=1)
    env.plan = {key: ["raise"] for key in range(1000)}
    with pytest.raises(modes.ProcessFailedError, match="15 rollouts in a row raised an error"):
        await modes.process(env)
    assert len(env.calls) == modes.RAISED_IN_A_ROW


@pytest.mark.parametrize("field", ["process_max_attempts_without_group",
                                   "process_max_minutes_without_group"])  # fmt: skip
@pytest.mark.parametrize("value", [0, -2])
def test_a_budget_is_positive_or_minus_one(field: str, value: int) -> None:
    with pytest.raises(ValueError, match="must be > 0, or -1 to never stop"):
        BaseEnvConfig(**{field: value})
    assert getattr(BaseEnvConfig(**{field: -1}), field) == -1


ALWAYS_FAILS = """
from atroposlib.envs.base import BaseEnv, BaseEnvConfig

class Broken(BaseEnv):
    name = "broken"

    @classmethod
    def config_init(cls):
        return BaseEnvConfig(group_size=2, use_wandb=False), []

    async def get_next_item(self):
        return {"q": 1}

    async def collect_trajectories(self, item):
        raise ValueError("dataset row has no answer")

if __name__ == "__main__":
    Broken.cli()
"""


@pytest.mark.slow
def test_nothing_written_exits_non_zero_with_one_line_saying_why(tmp_path: Path) -> None:
    script = tmp_path / "broken_env.py"
    script.write_text(textwrap.dedent(ALWAYS_FAILS))
    out = tmp_path / "out.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            "process",
            "--testing",
            f"--env.data_path_to_save_groups={out}",
        ],
        env=child_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: process wrote no group:"), last
    assert "ValueError in collect_trajectories: dataset row has no answer" in last
    assert not out.exists()
