"""One reply graded three ways: format, strict (format and right) and lenient (right at all).

Held-out evaluations report all three, so a gain can be split into "learned the output format"
and "got more answers right". ``is_right`` is the task's own check of an answer string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from atroposlib.envs.reward_fns.answers import extract_answer_tag, extract_final_number
from atroposlib.envs.reward_fns.format_rewards import answer_tag_format_reward


@dataclass(frozen=True)
class Graded:
    formatted: bool
    """Exactly one ``<answer>`` block (after an optional ``<think>``) and nothing else."""
    strict: bool
    """Formatted, and the content of the ``<answer>`` block is right."""
    lenient: bool
    """The ``<answer>`` content is right, or (no non-empty tag) the reply's final number is."""


def grade_answer(reply: str, is_right: Callable[[str], bool]) -> Graded:
    """Grade ``reply`` with the task's check ``is_right``.

    >>> def right(answer: str) -> bool:
    ...     return answer == "12"
    >>> grade_answer("<answer>12</answer>", right)
    Graded(formatted=True, strict=True, lenient=True)
    >>> grade_answer("7 + 5 = 12", right)
    Graded(formatted=False, strict=False, lenient=True)
    >>> grade_answer("It is <answer>12</answer>.", right)
    Graded(formatted=False, strict=False, lenient=True)
    >>> grade_answer("<answer>13</answer>", right)
    Graded(formatted=True, strict=False, lenient=False)
    >>> grade_answer("12, so the tags: <answer></answer>", right)
    Graded(formatted=False, strict=False, lenient=True)
    """
    formatted = answer_tag_format_reward([reply])[0] > 0
    tagged = extract_answer_tag(reply)
    strict = formatted and tagged is not None and is_right(tagged)
    answer = tagged if tagged else extract_final_number(reply)
    lenient = answer is not None and is_right(answer)
    return Graded(formatted, strict, lenient)
