"""Metric trackers on rank 0: wandb when enabled, a JSONL file when asked, else a null object."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import orjson

from example_trainer.config import TrainerConfig


class Tracker(Protocol):
    def log(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def finish(self) -> None: ...


class NullTracker:
    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        """No tracker configured."""

    def finish(self) -> None:
        """No tracker configured."""


class JsonlTracker:
    """One line per call, flushed at once so a live panel can follow it."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab")

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        self._file.write(orjson.dumps({"step": step, **metrics}) + b"\n")
        self._file.flush()

    def finish(self) -> None:
        self._file.close()


class Trackers:
    def __init__(self, trackers: list[Any]) -> None:
        self._trackers = trackers

    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        for tracker in self._trackers:
            tracker.log(metrics, step=step)

    def finish(self) -> None:
        for tracker in self._trackers:
            tracker.finish()


def make_tracker(cfg: TrainerConfig, rank: int) -> Tracker:
    if rank != 0:
        return NullTracker()
    trackers: list[Any] = []
    if cfg.metrics_file is not None:
        trackers.append(JsonlTracker(cfg.metrics_file))
    if cfg.wandb.enabled:
        import wandb

        trackers.append(
            wandb.init(
                project=cfg.wandb.project,
                group=cfg.wandb.group,
                name=cfg.wandb.name,
                config=cfg.model_dump(mode="json"),
            )
        )
    return Trackers(trackers) if trackers else NullTracker()
