"""``accuracy``: is the reply's (boxed, LaTeX or ``####``) answer equal to the ground truth."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.answers import extract_boxed, final_answer
from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

logger = logging.getLogger(__name__)

_GSM8K_NUMBER = re.compile(r"####\s*([\d\.]+)")


def _as_number(text: str) -> float:
    return float(text.replace(",", "").strip())


def _math_verify_equal(content: str, gold: float | int | str) -> bool | None:
    """math-verify's verdict, or None when the reply has no parsable answer."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    normalization = NormalizationConfig(
        nits=False, malformed_operators=False, basic_latex=True, equations=True,
        boxed="all", units=True,
    )  # fmt: skip
    extraction = LatexExtractionConfig(
        normalization_config=normalization, boxed_match_priority=0,
        try_extract_without_anchor=False,
    )  # fmt: skip
    answer = parse(content, extraction_config=[extraction], extraction_mode="first_match")
    if not answer:
        return None
    gold_text = gold if isinstance(gold, str) and "\\boxed" in gold else f"\\boxed{{{gold}}}"
    parsed_gold = parse(
        gold_text, extraction_mode="first_match", extraction_config=[LatexExtractionConfig()]
    )
    return bool(verify(answer, parsed_gold)) if parsed_gold else None


def verify_answer(content: str, gold: float | int | str, tolerance: float = 1e-6) -> bool:
    """math-verify first; for a numeric gold answer, the last ``\\boxed{}`` or ``#### x``
    compared as numbers when math-verify finds nothing.

    >>> verify_answer(r"The answer is \\boxed{\\frac{1}{2}}", "0.5")
    True
    >>> verify_answer("so #### 42", "#### 42"), verify_answer(r"\\boxed{41}", 42)
    (True, False)
    """
    if isinstance(gold, str) and "####" in gold:
        gold = final_answer(gold)
    gold_value: float | None = None
    if isinstance(gold, int | float):
        gold_value = float(gold)
    else:
        try:
            gold_value = _as_number(extract_boxed(gold) or gold)
        except ValueError:
            gold_value = None
    try:
        verdict = _math_verify_equal(content, gold)
    except Exception as error:  # math-verify raises many things on hostile input
        logger.debug("math-verify failed on %r: %s", content[:200], error)
        verdict = None
    if verdict is not None:
        return verdict
    if gold_value is None:
        return False
    boxed = extract_boxed(content)
    try:
        if boxed is not None:
            return abs(_as_number(boxed) - gold_value) < tolerance
        if "####" in content and (match := _GSM8K_NUMBER.search(content)):
            return abs(_as_number(match.group(1)) - gold_value) < tolerance
    except ValueError:
        return False
    return False


@registry.register
class AccuracyReward(RewardFunction):
    """1.0 when the answer after ``</think>`` matches ``ground_truth`` (else ``solution``)."""

    def __init__(
        self,
        tolerance: float = 1e-6,
        split_on_think_tag: bool = True,
        max_boxed_threshold: int = 6,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.tolerance = tolerance
        self.split_on_think_tag = split_on_think_tag
        self.max_boxed_threshold = max_boxed_threshold

    def compute(
        self,
        completions: Sequence[Any],
        solution: str | Sequence[str] | None = None,
        ground_truth: str | Sequence[str] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """
        >>> AccuracyReward()([r"<think>hmm</think> \\boxed{4}", r"\\boxed{5}"], solution="4")
        [1.0, 0.0]
        """
        gold = ground_truth if ground_truth is not None else solution
        if gold is None:
            logger.warning("accuracy reward given no solution or ground_truth: scoring 0.0")
            return [0.0] * len(completions)
        answers = list(gold) if isinstance(gold, list | tuple) else [gold] * len(completions)
        return [self._score(self.get_content(c), a) for c, a in zip(completions, answers)]  # noqa: B905

    def _score(self, content: str, gold: Any) -> float:
        if self.split_on_think_tag and "</think>" in content:
            content = content.split("</think>")[-1]
            if content.count("\\boxed") > self.max_boxed_threshold:
                return 0.0  # boxing every candidate answer is not an answer
        return 1.0 if verify_answer(content, gold, self.tolerance) else 0.0


def accuracy_reward(
    completions: Sequence[Any],
    solution: str | Sequence[str] | None = None,
    ground_truth: str | Sequence[str] | None = None,
    **kwargs: Any,
) -> list[float]:
    """Function form of :class:`AccuracyReward` (unweighted)."""
    return AccuracyReward().compute(completions, solution=solution, ground_truth=ground_truth)
