"""What an env measures between two wandb logs: lengths, scores, rollouts, task timings."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from atroposlib.envs.config import BaseEnvConfig
from atroposlib.group import MASK_IGNORE_INDEX


def summarize(name: str, values: list[float]) -> dict[str, float]:
    """mean/std/min/max of ``values`` under ``name``.

    >>> summarize("x", [1.0, 3.0])
    {'x_mean': 2.0, 'x_std': 1.0, 'x_min': 1.0, 'x_max': 3.0}
    """
    if not values:
        return {}
    return {
        f"{name}_mean": statistics.fmean(values),
        f"{name}_std": statistics.pstdev(values),
        f"{name}_min": min(values),
        f"{name}_max": max(values),
    }


@dataclass
class PerfStats:
    durations_ok: list[float] = field(default_factory=list)
    durations_failed: list[float] = field(default_factory=list)
    failed: int = 0
    rejected: Counter[str] = field(default_factory=Counter)

    def record(self, seconds: float, *, ok: bool) -> None:
        (self.durations_ok if ok else self.durations_failed).append(seconds)

    def drain(self) -> dict[str, float]:
        out = summarize("perf/task_duration", self.durations_ok)
        out.update(summarize("perf/failed_task_duration", self.durations_failed))
        out["perf/tasks_succeeded"] = float(len(self.durations_ok))
        out["perf/tasks_failed"] = float(len(self.durations_failed) + self.failed)
        for reason, count in self.rejected.items():
            out[f"perf/groups_rejected/{reason}"] = float(count)
        self.durations_ok, self.durations_failed, self.failed = [], [], 0
        self.rejected = Counter()
        return out


class RolloutStats:
    def __init__(self, config: BaseEnvConfig) -> None:
        self.config = config
        self.completion_lengths: list[int] = []
        self.scores: list[float] = []
        self.perf = PerfStats()

    def observe(self, group: dict[str, Any]) -> None:
        for mask in group["masks"]:
            self.completion_lengths.append(sum(1 for m in mask if m != MASK_IGNORE_INDEX))
        self.scores.extend(float(s) for s in group["scores"])

    def drain(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out.update(
            summarize("train/completion_lengths", [float(x) for x in self.completion_lengths])
        )
        out.update(summarize("train/scores", self.scores))
        out.update(self.perf.drain())
        self.completion_lengths, self.scores = [], []
        return out
