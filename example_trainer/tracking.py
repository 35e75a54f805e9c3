"""Metric trackers: wandb on rank 0 when enabled, else a null object with the same methods."""

from __future__ import annotations

from typing import Any

from example_trainer.config import TrainerConfig


class NullTracker:
    def log(self, metrics: dict[str, float], step: int | None = None) -> None:
        """No tracker configured."""

    def finish(self) -> None:
        """No tracker configured."""


def make_tracker(cfg: TrainerConfig, rank: int) -> Any:
    if rank != 0 or not cfg.wandb.enabled:
        return NullTracker()
    import wandb

    return wandb.init(
        project=cfg.wandb.project,
        group=cfg.wandb.group,
        name=cfg.wandb.name,
        config=cfg.model_dump(mode="json"),
    )
