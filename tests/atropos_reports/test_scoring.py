"""Atropos reports about scores and advantages (register: docs/atropos-reports.md)."""

from __future__ import annotations

import math

import pytest

from atroposlib.envs.groups import group_rejection_reason
from atroposlib.envs.reward_fns import code_rewards, format_rewards, math_rewards
from atroposlib.envs.reward_fns.combined_reward import CombinedReward
from atroposlib.envs.reward_fns.registry import RewardRegistry, registry
from atroposlib.group import ScoredData
from atroposlib.utils.advantages import (
    compute_grpo_process_supervision_advantages,
    compute_stats,
    grouped_advantages,
)

CONSTANT_FLOATS = [[0.1] * 3, [0.7] * 3, [0.3] * 7, [[0.1, 0.1], [0.1]], [1e-3] * 16]


@pytest.mark.parametrize("rewards", CONSTANT_FLOATS)
def test_481_constant_float_rewards_have_a_variance_of_zero_not_below(rewards: list) -> None:
    assert 0.0 <= compute_stats(rewards)["var"] < 1e-20


@pytest.mark.parametrize("rewards", CONSTANT_FLOATS)
def test_481_a_constant_group_is_the_documented_value_error_not_a_type_error(
    rewards: list,
) -> None:
    steps = rewards if isinstance(rewards[0], list) else [rewards]
    with pytest.raises(ValueError, match="tolerance"):
        compute_grpo_process_supervision_advantages(steps)


def test_481_the_variance_is_still_the_population_variance() -> None:
    stats = compute_stats([[1, 2], 3, [4, [5, 6]]])
    assert stats["mean"] == 3.5 and math.isclose(stats["var"], 35 / 12)


@pytest.mark.parametrize("scores", [[0.7] * 4, [0.1] * 8, [1.0 / 3] * 5])
@pytest.mark.parametrize("baseline", ["group_mean", "leave_one_out"])
def test_457_float_noise_in_a_constant_group_is_not_amplified(
    scores: list[float], baseline: str
) -> None:
    for std in ("group", "batch"):
        [advantages] = grouped_advantages([scores], baseline, std)  # type: ignore[arg-type]
        assert max(abs(a) for a in advantages) < 1e-9


def test_485_each_sub_reward_counts_with_its_weight() -> None:
    think = {"type": "format", "weight": 1.0, "params": {"preferred_tags": ["think"]}}
    answer = {"type": "format", "weight": 3.0, "params": {"preferred_tags": ["answer"]}}
    replies = ["<think>a</think>", "<answer>b</answer>", "<think>a</think><answer>b</answer>"]
    assert CombinedReward([think, answer]).compute(replies) == [1.0, 3.0, 4.0]
    assert CombinedReward([think, answer], normalization="sum").compute(replies) == [
        0.25, 0.75, 1.0,
    ]  # fmt: skip
    assert CombinedReward([think, answer], normalization="minmax").compute(replies) == [
        0.0, 2 / 3, 1.0,
    ]  # fmt: skip
    outer = CombinedReward([think, answer], weight=0.5)
    assert outer(replies) == [0.5, 1.5, 2.0]  # the combined reward's own weight on top


MODULES_WITH_SEVERAL = {
    "answer_tag_format": format_rewards.answer_tag_format_reward,
    "answer_tag_partial_format": format_rewards.answer_tag_partial_format_reward,
    "gsm8k": math_rewards.gsm8k_reward,
    "boxed_math": math_rewards.boxed_math_reward,
    "code_execution": code_rewards.code_execution_reward,
    "test_pass_rate": code_rewards.pass_rate_reward,
}
"""Rewards that share a module with others: each name must give its own reward."""


@pytest.mark.parametrize("name", sorted(MODULES_WITH_SEVERAL))
def test_482_a_name_gives_its_own_reward_not_the_first_in_its_module(name: str) -> None:
    for fresh in (registry, RewardRegistry()):  # a fresh one loads the module's rewards anew
        assert fresh.get(name) is MODULES_WITH_SEVERAL[name]
        assert fresh.get(f"{name}_reward") is MODULES_WITH_SEVERAL[name]


def test_34_a_group_of_one_is_kept_although_its_scores_are_all_equal() -> None:
    group = ScoredData(tokens=[[1, 2, 3]], masks=[[-100, 2, 3]], scores=[1.0])
    reason = group_rejection_reason(
        group, group_size=1, max_token_len=8, ensure_scores_are_not_same=True
    )
    assert reason is None
    pair = ScoredData(tokens=[[1, 2], [1, 3]], masks=[[-100, 2], [-100, 3]], scores=[1.0, 1.0])
    assert group_rejection_reason(
        pair, group_size=2, max_token_len=8, ensure_scores_are_not_same=True
    )  # two equal scores still carry no signal
