"""Pure reward functions ``(completions, **kwargs) -> list[float]`` and their registry."""

from atroposlib.envs.reward_fns import builtin
from atroposlib.envs.reward_fns.registry import (
    RewardFn,
    combine,
    completion_text,
    get_reward,
    list_rewards,
    register_reward,
)

__all__ = [
    "RewardFn",
    "builtin",
    "combine",
    "completion_text",
    "get_reward",
    "list_rewards",
    "register_reward",
]
