"""Request options that Atropos 0.4 added for reasoning models and token-id stops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VALID_REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh"})
EFFORT_TO_MAX_TOKENS = {
    "none": 1024, "minimal": 3200, "low": 6400, "medium": 16000, "high": 25600, "xhigh": 30400,
}  # fmt: skip


@dataclass
class ReasoningConfig:
    """Thinking-mode options injected into chat requests (``extra_body``).

    Setting ``effort`` or ``max_tokens`` turns it on. OpenAI's own API gets
    ``reasoning_effort``; other providers (OpenRouter, vLLM, ...) get ``reasoning: {...}``.

    >>> ReasoningConfig(effort="high").build_extra_body("http://localhost:9001/v1")
    {'reasoning': {'enabled': True, 'effort': 'high'}}
    >>> ReasoningConfig(enabled=True).build_extra_body("https://api.openai.com/v1")
    {'reasoning_effort': 'medium'}
    >>> ReasoningConfig().build_extra_body() is None
    True
    >>> ReasoningConfig(effort="extreme")
    Traceback (most recent call last):
    ValueError: Invalid reasoning_effort 'extreme': use one of ['high', 'low', ..., 'xhigh']
    """

    enabled: bool = False
    effort: str | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.effort is not None and self.effort not in VALID_REASONING_EFFORTS:
            raise ValueError(
                f"Invalid reasoning_effort {self.effort!r}: use one of "
                f"{sorted(VALID_REASONING_EFFORTS)}"
            )
        if self.effort is not None or self.max_tokens is not None:
            self.enabled = True

    def is_reasoning_kwargs_active(self) -> bool:
        return self.enabled

    def build_extra_body(
        self, base_url: str | None = None, use_max_tokens: bool = False
    ) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        if base_url and "api.openai.com" in base_url:
            return {"reasoning_effort": self.effort or "medium"}
        reasoning: dict[str, Any] = {"enabled": True}
        if use_max_tokens and self.effort is not None:
            reasoning["max_tokens"] = EFFORT_TO_MAX_TOKENS.get(self.effort, 8192)
        elif self.effort is not None:
            reasoning["effort"] = self.effort
        elif self.max_tokens is not None:
            reasoning["max_tokens"] = self.max_tokens
        return {"reasoning": reasoning}

    @classmethod
    def from_env_config(cls, env_config: Any) -> ReasoningConfig:
        effort = getattr(env_config, "reasoning_effort", None)
        max_tokens = getattr(env_config, "max_reasoning_tokens", None)
        enabled = bool(getattr(env_config, "thinking_mode", False))
        return cls(enabled=enabled or effort is not None or max_tokens is not None,
                   effort=effort, max_tokens=max_tokens)  # fmt: skip


def inject_reasoning(
    kwargs: dict[str, Any], config: ReasoningConfig | None, base_url: str | None
) -> dict[str, Any]:
    """Chat kwargs with the reasoning options merged into ``extra_body``; a caller's
    ``skip_reasoning=True`` opts out. OpenAI's API also needs temperature 1.0 and
    ``max_completion_tokens``."""
    kwargs = dict(kwargs)
    if kwargs.pop("skip_reasoning", False) or config is None:
        return kwargs
    extra = config.build_extra_body(base_url)
    if not extra:
        return kwargs
    kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), **extra}
    if base_url and "api.openai.com" in base_url:
        kwargs["temperature"] = 1.0
        if kwargs.get("max_tokens"):
            kwargs["max_completion_tokens"] = kwargs.pop("max_tokens")
    return kwargs


def split_stop(options: dict[str, Any]) -> dict[str, Any]:
    """``stop`` may hold token ids (Atropos envs pass ``[tokenizer.eos_token_id]``): they move
    to ``stop_token_ids``, the strings stay in ``stop``.

    >>> split_stop({"stop": [2, "</answer>"], "stop_token_ids": [7]})
    {'stop_token_ids': [7, 2], 'stop': ['</answer>']}
    >>> split_stop({"stop": 2})
    {'stop_token_ids': [2]}
    >>> split_stop({"stop": "x"})
    {'stop': 'x'}
    """
    stop = options.get("stop")
    if stop is None or isinstance(stop, str):
        return options
    entries = list(stop) if isinstance(stop, list | tuple) else [stop]
    ids = [int(e) for e in entries if isinstance(e, int) and not isinstance(e, bool)]
    if not ids:
        return options
    out = {k: v for k, v in options.items() if k != "stop"}
    strings = [e for e in entries if isinstance(e, str)]
    if strings:
        out["stop"] = strings
    out["stop_token_ids"] = [*(options.get("stop_token_ids") or []), *ids]
    return out
