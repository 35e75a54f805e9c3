"""``CombinedReward``: the sum of several registered rewards, optionally normalised."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

logger = logging.getLogger(__name__)


@registry.register
class CombinedReward(RewardFunction):
    """Sum of each sub-reward's ``compute`` times its ``weight``; ``normalization`` is
    ``"none"``, ``"sum"`` (divide by the sub-rewards' total weight: their weighted mean) or
    ``"minmax"`` (rescale to [0, 1]). Atropos 0.4 summed the unweighted scores, so weights did
    nothing (its PR #485).

    >>> CombinedReward(["format", {"type": "format", "params": {"preferred_tags": ["x"]}}],
    ...                normalization="sum")(["<think>a</think>", "<x>b</x>"])
    [0.5, 0.5]
    >>> CombinedReward(["format", {"type": "format", "weight": 3.0,
    ...                 "params": {"preferred_tags": ["x"]}}])(["<think>a</think>", "<x>b</x>"])
    [1.0, 3.0]
    """

    def __init__(
        self,
        rewards: Sequence[str | dict[str, Any]],
        normalization: str = "none",
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.normalization = normalization
        self.reward_functions = [registry.create(config) for config in rewards]

    @property
    def name(self) -> str:
        return f"combined({','.join(r.name for r in self.reward_functions)})"

    def set_wandb_logger(self, logger: Any) -> None:
        super().set_wandb_logger(logger)
        for reward in self.reward_functions:
            reward.set_wandb_logger(logger)

    def compute(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        totals = [0.0] * len(completions)
        for reward in self.reward_functions:
            try:
                scores = reward.compute(completions, **kwargs)
            except Exception:  # one broken part scores 0 for everyone, the rest still count
                logger.exception("reward %s failed inside %s", reward.name, self.name)
                continue
            totals = [total + float(score) * reward.weight
                      for total, score in zip(totals, scores)]  # noqa: B905  # fmt: skip
        if self.normalization == "sum":
            weight = sum(r.weight for r in self.reward_functions)
            return [t / weight for t in totals] if weight > 0 else totals
        if self.normalization == "minmax" and totals and max(totals) > min(totals):
            low, high = min(totals), max(totals)
            return [(t - low) / (high - low) for t in totals]
        return totals
