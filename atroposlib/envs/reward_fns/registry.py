"""Reward functions by name: ``@register_reward("name")`` and ``get_reward("name")``.

A reward function is pure: ``(completions, **kwargs) -> list[float]``, one score per
completion. A completion is a string or a chat (a list of messages; the last one is scored).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from atroposlib.errors import ConfigError

RewardFn = Callable[..., list[float]]

_REGISTRY: dict[str, RewardFn] = {}


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register ``fn`` under ``name`` (a name may be registered once)."""

    def decorate(fn: RewardFn) -> RewardFn:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ConfigError(f"reward {name!r} is already registered")
        _REGISTRY[name] = fn
        return fn

    return decorate


def get_reward(name: str) -> RewardFn:
    """The reward registered as ``name``.

    >>> get_reward("format")(["<think>x</think> 4"])
    [1.0]
    """
    if name not in _REGISTRY:
        raise ConfigError(f"unknown reward {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def list_rewards() -> list[str]:
    return sorted(_REGISTRY)


def completion_text(completion: str | Sequence[Any]) -> str:
    """The text to score: the string itself, or the content of a chat's last message.

    >>> completion_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    'a'
    """
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    last = completion[-1]
    content = last.get("content", "") if isinstance(last, dict) else last
    return content if isinstance(content, str) else str(content)


def combine(
    rewards: Sequence[tuple[RewardFn, float]], completions: Sequence[Any], **kwargs: Any
) -> list[float]:
    """Weighted sum of several rewards.

    >>> combine([(get_reward("format"), 0.5), (get_reward("length"), 0.5)], ["<think>a</think>b"],
    ...         max_length=100)
    [1.0]
    """
    totals = [0.0] * len(completions)
    for fn, weight in rewards:
        for index, value in enumerate(fn(completions, **kwargs)):
            totals[index] += weight * value
    return totals
