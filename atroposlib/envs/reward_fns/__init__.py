"""Pure reward functions ``(completions, **kwargs) -> list[float]`` and their registry."""

from atroposlib.envs.reward_fns import (
    builtin,
    code_rewards,
    format_rewards,
    math_rewards,
    tool_call_rewards,
)
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
    "code_rewards",
    "combine",
    "completion_text",
    "format_rewards",
    "get_reward",
    "list_rewards",
    "math_rewards",
    "register_reward",
    "tool_call_rewards",
]
