"""``repetition_penalty``: 0.0 for varied text down to -1.0 for heavy repetition."""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

DEFAULT_COMPONENT_WEIGHTS = {
    "word_repetition": 0.3, "phrase_repetition": 0.4, "consecutive_repetition": 0.6,
    "beginning_repetition": 0.5,
}  # fmt: skip
DEFAULT_STOPWORDS = frozenset({
    "this", "that", "with", "from", "what", "when", "where", "which", "who", "whom", "whose",
    "will", "shall", "should", "would", "could", "have", "has", "had", "been", "being", "than",
    "then", "there", "these", "those", "their",
})  # fmt: skip


def _repeats(counts: Counter[str], minimum: int = 2) -> int:
    return sum(count - 1 for count in counts.values() if count >= minimum)


@registry.register
class RepetitionPenaltyReward(RewardFunction):
    """Texts under ``min_words``/``min_sentences`` get ``short_text_penalty``; a repeated
    sentence of 4+ words gets ``paragraph_repetition_base_penalty`` minus up to 0.4; otherwise
    a weighted rate of repeated words, 3-5-grams, stutters and sentence openings above
    ``threshold`` maps linearly to [-1.0, -0.1].

    >>> reward = RepetitionPenaltyReward()
    >>> reward(["The cat sat on the mat. A dog ran in the park. Birds sang all morning long."])
    [0.0]
    >>> reward(["I like it a lot. I like it a lot. I like it a lot."])
    [-0.8666666666666667]
    >>> reward(["Too short."])
    [-0.1]
    """

    def __init__(
        self,
        threshold: float = 0.05,
        min_words: int = 10,
        min_sentences: int = 2,
        short_text_penalty: float = -0.1,
        paragraph_repetition_base_penalty: float = -0.6,
        component_weights: dict[str, float] | None = None,
        stopwords: set[str] | None = None,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.threshold = threshold
        self.min_words = min_words
        self.min_sentences = min_sentences
        self.short_text_penalty = short_text_penalty
        self.paragraph_repetition_base_penalty = paragraph_repetition_base_penalty
        self.component_weights = {**DEFAULT_COMPONENT_WEIGHTS, **(component_weights or {})}
        self.stopwords = set(stopwords or DEFAULT_STOPWORDS)

    def compute(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [self._penalty(self.get_content(c)) for c in completions]

    def _penalty(self, text: str) -> float:
        words = re.findall(r"\b\w+\b", text.lower())
        sentences = [s.strip() for s in re.split(r"[.!?]", text) if s.strip()]
        if len(words) < self.min_words or len(sentences) < self.min_sentences:
            return self.short_text_penalty
        repeated_sentences = sum(
            count - 1 for sentence, count in Counter(sentences).items()
            if count > 1 and len(sentence.split()) > 3
        )  # fmt: skip
        if repeated_sentences:
            share = min(1.0, repeated_sentences / len(sentences))
            return self.paragraph_repetition_base_penalty - share * 0.4
        score = sum(
            rate * self.component_weights.get(name, 0.0)
            for name, rate in self._rates(words, sentences).items()
        )
        if score <= self.threshold:
            return 0.0
        return min(-min(1.0, (score - self.threshold) / (1 - self.threshold)), -0.1)

    def _rates(self, words: list[str], sentences: list[str]) -> dict[str, float]:
        counts = Counter(words)
        meaningful = {w for w in counts if len(w) > 3 and w not in self.stopwords}
        repeated_words = sum(c - 1 for w, c in counts.items() if c > 2 and w in meaningful)
        phrases = 0.0
        for n in range(3, 6) if len(words) >= 5 else ():
            grams = Counter(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))
            phrases += _repeats(grams) * n / 3
        stutters = sum(1 for a, b in itertools.pairwise(words) if a == b and len(b) > 2)
        openings = Counter(" ".join(s.split()[:3]) for s in sentences if len(s.split()) >= 3)
        return {
            "word_repetition": repeated_words / len(words),
            "phrase_repetition": phrases / len(words),
            "consecutive_repetition": stutters / len(words),
            "beginning_repetition": _repeats(openings) / len(sentences),
        }


def repetition_penalty_reward(
    completions: Sequence[Any], threshold: float = 0.05, **kwargs: Any
) -> list[float]:
    """Function form of :class:`RepetitionPenaltyReward`."""
    return RepetitionPenaltyReward(threshold=threshold).compute(completions)
