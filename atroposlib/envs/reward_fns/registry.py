"""Rewards by name: one registry for class rewards (Atropos's ``registry``) and pure functions.

Pure functions ``(completions, **kwargs) -> list[float]`` register with
``@register_reward("name")``; ``RewardFunction`` classes with ``@registry.register`` (named
after the class, ``MyThingReward`` -> ``mything``). ``registry.create(name_or_config)`` builds a
``RewardFunction`` for either kind; ``get_reward(name)`` returns something callable.

Built-in rewards live in their own modules and are imported on first use, as Atropos did;
each answers to its short name and to ``<name>_reward`` (``"accuracy"``, ``"accuracy_reward"``).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast, overload

from atroposlib.envs.reward_fns.reward_function import RewardFunction
from atroposlib.errors import ConfigError

logger = logging.getLogger(__name__)

RewardFn = Callable[..., list[float]]
RewardEntry = type[RewardFunction] | RewardFn

_PACKAGE = "atroposlib.envs.reward_fns"
BUILTIN_REWARDS: dict[str, tuple[str, str]] = {
    "accuracy": ("accuracy_reward", "AccuracyReward"),
    "format": ("format_reward", "FormatReward"),
    "reasoning_steps": ("reasoning_steps_reward", "ReasoningStepsReward"),
    "crossword_format": ("crossword_format_reward", "CrosswordFormatReward"),
    "repetition_penalty": ("repetition_penalty_reward", "RepetitionPenaltyReward"),
    "combined": ("combined_reward", "CombinedReward"),
    "gsm8k": ("math_rewards", "gsm8k_reward"),
    "boxed_math": ("math_rewards", "boxed_math_reward"),
    "answer_tag_format": ("format_rewards", "answer_tag_format_reward"),
    "answer_tag_partial_format": ("format_rewards", "answer_tag_partial_format_reward"),
    "code_execution": ("code_rewards", "code_execution_reward"),
    "test_pass_rate": ("code_rewards", "pass_rate_reward"),
    "tool_call_match": ("tool_call_rewards", "tool_call_match_reward"),
}
"""Short name -> (module under ``atroposlib.envs.reward_fns``, the reward in it)."""


def _short(name: str) -> str:
    return name.removesuffix("_reward")


class RewardRegistry:
    """Atropos's registry API (``register``, ``register_function``, ``create``, ``get``)."""

    def __init__(self) -> None:
        self._registry: dict[str, RewardEntry] = {}

    @overload
    def register(
        self, cls: type[RewardFunction], name: str | None = None
    ) -> type[RewardFunction]: ...

    @overload
    def register(
        self, cls: None = None, name: str | None = None
    ) -> Callable[[type[RewardFunction]], type[RewardFunction]]: ...

    def register(self, cls: type[RewardFunction] | None = None, name: str | None = None) -> Any:
        """Class decorator: ``@registry.register`` or ``@registry.register(name="x")``."""

        def decorate(reward_cls: type[RewardFunction]) -> type[RewardFunction]:
            if not inspect.isclass(reward_cls) or not issubclass(reward_cls, RewardFunction):
                raise TypeError(f"{reward_cls!r} is not a subclass of RewardFunction")
            key = name or reward_cls.__name__.lower().removesuffix("reward")
            self._registry[key] = reward_cls
            return reward_cls

        return decorate if cls is None else decorate(cls)

    def register_function(self, name: str, function: RewardFn) -> None:
        """Register a pure function reward under ``name``."""
        current = self._registry.get(name)
        if current is not None and current is not function and not inspect.isclass(current):
            raise ConfigError(f"reward {name!r} is already registered")
        self._registry[name] = function

    def get(self, name: str) -> RewardEntry:
        """The class or function registered as ``name`` (built-ins are imported on demand)."""
        for key in (name, _short(name)):
            if key not in self._registry and key in BUILTIN_REWARDS:
                module, attribute = BUILTIN_REWARDS[key]
                loaded = importlib.import_module(f"{_PACKAGE}.{module}")
                self._registry.setdefault(key, getattr(loaded, attribute))
            if key in self._registry:
                return self._registry[key]
        known = sorted({*self._registry, *BUILTIN_REWARDS})
        raise ConfigError(f"unknown reward {name!r}; registered: {known}")

    def create(self, name_or_config: str | dict[str, Any], **kwargs: Any) -> RewardFunction:
        """An instance from a name, or from ``{"type": name, "params": {...}, **params}``;
        config values override ``kwargs``."""
        if isinstance(name_or_config, str):
            reward_type, params = name_or_config, dict(kwargs)
        else:
            config = dict(name_or_config)
            if "type" not in config:
                raise ConfigError(f"reward config {name_or_config!r} has no 'type' key")
            reward_type = config.pop("type")
            config.update(config.pop("params", None) or {})
            params = {**kwargs, **config}
        entry = self.get(reward_type)
        if inspect.isclass(entry):
            return cast(RewardFunction, entry(**params))
        return LegacyFunctionWrapper(entry, **params)

    def list_registered(self) -> list[str]:
        return list(self._registry)

    def load_required_functions(self, config: Any) -> set[str]:
        """Load every reward a config names (``reward_funcs``/``reward_functions``, also
        under each of ``config.datasets``); returns the names."""
        names: set[str] = set()
        holders = [config, *(getattr(config, "datasets", None) or [])]
        for holder in holders:
            for field in ("reward_functions", "reward_funcs", "dataset_reward_funcs"):
                for entry in getattr(holder, field, None) or []:
                    if isinstance(entry, dict) and "type" in entry:
                        names.add(entry["type"])
                    elif isinstance(entry, str):
                        names.add(entry)
            for type_config in getattr(holder, "types", None) or []:
                names.update(type_config.get("reward_funcs", []))
        for reward_name in names:
            self.get(reward_name)
        return names


class LegacyFunctionWrapper(RewardFunction):
    """A pure function reward seen as a ``RewardFunction``."""

    def __init__(self, func: RewardFn, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.func = func

    @property
    def name(self) -> str:
        return self._name or str(getattr(self.func, "__name__", "reward"))

    def compute(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        result = self.func(completions, **{**self.config, **kwargs})
        return list(result) if isinstance(result, list | tuple) else [result] * len(completions)


registry = RewardRegistry()


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register a pure function reward under ``name`` (a name may be registered once)."""

    def decorate(fn: RewardFn) -> RewardFn:
        registry.register_function(name, fn)
        return fn

    return decorate


def get_reward(name: str) -> RewardFn:
    """A callable for the reward ``name``: the function itself, or an instance of the class.

    >>> get_reward("answer_tag_format")(["<answer>4</answer>", "4"])
    [1.0, 0.0]
    >>> get_reward("format_reward")(["<think>x</think> 4", "4"])
    [1.0, 0.0]
    """
    entry = registry.get(name)
    return cast(RewardFn, entry() if inspect.isclass(entry) else entry)


def list_rewards() -> list[str]:
    """Every reward name, built-ins included."""
    return sorted({*registry.list_registered(), *BUILTIN_REWARDS})


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

    >>> combine([(get_reward("format"), 0.5), (get_reward("answer_tag_format"), 0.5)],
    ...         ["<think>a</think><answer>b</answer>"])
    [1.0]
    """
    totals = [0.0] * len(completions)
    for fn, weight in rewards:
        for index, value in enumerate(fn(completions, **kwargs)):
            totals[index] += weight * value
    return totals
