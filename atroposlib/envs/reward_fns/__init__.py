"""Rewards: pure functions ``(completions, **kwargs) -> list[float]``, ``RewardFunction``
classes, and one registry for both (Atropos 0.4's ``registry``, ``RewardFunction``,
``CombinedReward`` keep their import paths)."""

from atroposlib.envs.reward_fns.combined_reward import CombinedReward
from atroposlib.envs.reward_fns.registry import (
    RewardFn,
    RewardRegistry,
    combine,
    completion_text,
    get_reward,
    list_rewards,
    register_reward,
    registry,
)
from atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = [
    "CombinedReward",
    "RewardFn",
    "RewardFunction",
    "RewardRegistry",
    "combine",
    "completion_text",
    "get_reward",
    "list_rewards",
    "register_reward",
    "registry",
]
