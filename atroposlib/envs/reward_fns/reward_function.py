"""``RewardFunction``: Atropos 0.4's class form of a reward (weight, name, ``compute``).

A subclass implements ``compute(completions, **kwargs) -> list[float]``; calling the instance
returns the scores times ``weight``. A reward that raises scores every completion 0.0 and logs
the traceback (Atropos's behaviour: one broken reward must not stop a rollout).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)


class RewardFunction(ABC):
    """Base class of class-based rewards; register one with ``@registry.register``."""

    def __init__(self, weight: float = 1.0, name: str | None = None, **kwargs: Any) -> None:
        self.weight = weight
        self._name = name
        self.config = kwargs
        self.wandb_logger: Any = None

    @property
    def name(self) -> str:
        return self._name or type(self).__name__.lower()

    @abstractmethod
    def compute(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        """One unweighted score per completion."""

    def __call__(self, completions: Sequence[Any], **kwargs: Any) -> list[float]:
        try:
            raw = [float(score) for score in self.compute(completions, **kwargs)]
        except Exception:  # a reward is user code: count it as 0.0, never stop the rollout
            logger.exception("reward %s failed; scoring %d completions 0.0", self.name,
                             len(completions))  # fmt: skip
            return [0.0] * len(completions)
        weighted = [score * self.weight for score in raw]
        if self.wandb_logger is not None:
            self.log_metrics(raw, weighted)
        return weighted

    def set_wandb_logger(self, logger: Any) -> None:
        self.wandb_logger = logger

    def log_metrics(self, raw_rewards: list[float], weighted_rewards: list[float]) -> None:
        if self.wandb_logger is None or not raw_rewards:
            return
        self.wandb_logger.log(
            {
                f"reward/{self.name}/mean_raw": sum(raw_rewards) / len(raw_rewards),
                f"reward/{self.name}/mean_weighted": sum(weighted_rewards) / len(raw_rewards),
                f"reward/{self.name}/min": min(raw_rewards),
                f"reward/{self.name}/max": max(raw_rewards),
            }
        )

    @staticmethod
    def get_content(completion: Any) -> str:
        """The assistant text of a completion: a string, a message, ``{"message": ...}`` or a
        chat (its first assistant message); ``""`` when there is none.

        >>> RewardFunction.get_content({"message": {"role": "assistant", "content": "4"}})
        '4'
        >>> RewardFunction.get_content([{"role": "user", "content": "q"}])
        ''
        """
        if isinstance(completion, str):
            return completion
        if isinstance(completion, dict):
            message = completion.get("message", completion)
            if isinstance(message, dict) and message.get("role") == "assistant":
                return str(message.get("content", ""))
            return ""
        if isinstance(completion, list | tuple):
            for message in completion:
                if isinstance(message, dict) and message.get("role") == "assistant":
                    return str(message.get("content", ""))
        return ""
