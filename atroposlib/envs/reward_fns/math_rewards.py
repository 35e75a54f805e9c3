"""Math rewards: equivalence checked with math-verify (fractions, LaTeX, units stripped).

Every reward here is a pure function ``(completions, **kwargs) -> list[float]``; ``completions``
are the assistant replies as strings and each keyword is a list aligned with them (as in TRL).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.answers import extract_boxed, extract_final_number, strip_think
from atroposlib.envs.reward_fns.registry import completion_text, register_reward

logger = logging.getLogger(__name__)

_UNITS = re.compile(
    r"\\(?:text|mbox|mathrm)\{\s*[a-zA-Z ]*\}(?:\^\{?\d\}?)?|\^\\circ|\\%|%|\\\$|\$(?=\d)"
)


def _timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which exists only on the main thread.
    return 5 if threading.current_thread() is threading.main_thread() else None


def math_equivalent(prediction: str, gold: str) -> bool:
    """Whether ``prediction`` is mathematically the same as ``gold``.

    >>> math_equivalent(r"\\frac{1}{2}", "0.5")
    True
    >>> math_equivalent(r"12 \\text{ cm}", "12"), math_equivalent(r"28 \\text{ cm}^2", "28")
    (True, True)
    >>> math_equivalent(r"\\dfrac34", r"\\frac{3}{4}")
    True
    >>> math_equivalent("1+x^2", "x^2+1")
    True
    >>> math_equivalent("7", "8")
    False
    """
    from math_verify import parse, verify

    def wrap(text: str) -> str:
        return f"${_UNITS.sub('', text).strip()}$"

    timeout = _timeout()
    try:
        parsed_gold = parse(wrap(gold), parsing_timeout=timeout)
        parsed_pred = parse(wrap(prediction), parsing_timeout=timeout)
        if not parsed_gold or not parsed_pred:
            return False
        return bool(verify(parsed_gold, parsed_pred, timeout_seconds=timeout))
    except Exception as error:  # math-verify can raise nearly anything on hostile input
        logger.debug("math-verify failed on %r vs %r: %s", prediction, gold, error)
        return False


@register_reward("boxed_math")
def boxed_math_reward(
    completions: Sequence[Any], answer: Sequence[str], **_: object
) -> list[float]:
    """1.0 when the last ``\\boxed{}`` is equivalent to the answer, else 0.0 (no box: 0.0).

    >>> boxed_math_reward([r"\\boxed{\\frac{2}{4}}", r"\\boxed{2}", "1/2", ""], ["1/2"] * 4)
    [1.0, 0.0, 0.0, 0.0]
    """
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        boxed = extract_boxed(strip_think(completion_text(completion)))
        scores.append(1.0 if boxed is not None and math_equivalent(boxed, gold) else 0.0)
    return scores


@register_reward("gsm8k")
def gsm8k_reward(completions: Sequence[Any], answer: Sequence[str], **_: object) -> list[float]:
    """1.0 when the reply's final number (boxed or last) equals the GSM8K answer.

    ``answer`` may be the dataset's full solution text ending in ``#### n``.

    >>> replies = [r"so \\boxed{72}", "48 + 24 = 72", "about 70", "72.0 clips"]
    >>> gsm8k_reward(replies, ["... #### 72"] * 4)
    [1.0, 1.0, 0.0, 1.0]
    """
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        predicted = extract_final_number(completion_text(completion))
        expected = extract_final_number(gold)
        correct = predicted is not None and expected is not None
        scores.append(1.0 if correct and math_equivalent(predicted, expected) else 0.0)  # type: ignore[arg-type]
    return scores
