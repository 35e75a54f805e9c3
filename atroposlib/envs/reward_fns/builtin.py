"""The rewards that ship with atroposlib; each is pure and registered by name."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.registry import completion_text, register_reward

_THINK = re.compile(r"^\s*<think>.*?</think>\s*\S", re.DOTALL)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@register_reward("format")
def format_reward(completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """1.0 when the completion is ``<think>...</think>`` followed by an answer.

    >>> format_reward(["<think>2+2</think> 4", "4", "<think>unfinished"])
    [1.0, 0.0, 0.0]
    """
    return [1.0 if _THINK.match(completion_text(c)) else 0.0 for c in completions]


def extract_answer(text: str) -> str | None:
    """The last ``\\boxed{...}``, else the last number, else None.

    >>> extract_answer("so \\\\boxed{12} done"), extract_answer("it is 3 or 4")
    ('12', '4')
    >>> extract_answer("no") is None
    True
    """
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


@register_reward("accuracy")
def accuracy_reward(
    completions: Sequence[Any], *, solution: str | Sequence[str], **kwargs: Any
) -> list[float]:
    """1.0 when the extracted answer equals the solution (one, or one per completion).

    >>> accuracy_reward(["\\\\boxed{4}", "it is 5", "no idea"], solution="4")
    [1.0, 0.0, 0.0]
    >>> accuracy_reward(["1.50", "2"], solution=["1.5", "2"])
    [1.0, 1.0]
    """
    solutions = [solution] * len(completions) if isinstance(solution, str) else list(solution)
    scores = []
    for completion, expected in zip(completions, solutions, strict=True):
        answer = extract_answer(completion_text(completion))
        scores.append(1.0 if answer is not None and _same(answer, expected) else 0.0)
    return scores


def _same(answer: str, expected: str) -> bool:
    try:
        return abs(float(answer) - float(expected)) < 1e-9
    except ValueError:
        return answer.strip() == expected.strip()


@register_reward("length")
def length_reward(
    completions: Sequence[Any], *, max_length: int = 1024, **kwargs: Any
) -> list[float]:
    """1.0 up to ``max_length`` characters, then falling linearly to 0.0 at twice that.

    >>> length_reward(["a" * 10, "a" * 150, "a" * 300], max_length=100)
    [1.0, 0.5, 0.0]
    """
    scores = []
    for completion in completions:
        size = len(completion_text(completion))
        over = max(0, size - max_length) / max(1, max_length)
        scores.append(max(0.0, 1.0 - over))
    return scores


@register_reward("repetition_penalty")
def repetition_penalty(completions: Sequence[Any], *, ngram: int = 3, **kwargs: Any) -> list[float]:
    """0.0 for no repeated word n-grams down to -1.0 when every n-gram is a repeat.

    >>> repetition_penalty(["a b c d e", "x y z x y z x y z"])
    [0.0, -0.571...]
    """
    scores = []
    for completion in completions:
        words = completion_text(completion).split()
        grams = [tuple(words[i : i + ngram]) for i in range(max(0, len(words) - ngram + 1))]
        scores.append(len(set(grams)) / len(grams) - 1.0 if grams else 0.0)
    return scores
