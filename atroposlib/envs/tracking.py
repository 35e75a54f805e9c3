"""Metric trackers: wandb when enabled and installed, otherwise a tracker that does nothing."""

from __future__ import annotations

import logging
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class Tracker(Protocol):
    def log(self, metrics: dict[str, Any], step: int | None = None) -> None: ...

    def table(self, columns: list[str], rows: list[list[Any]]) -> Any: ...

    def finish(self) -> None: ...


class NullTracker:
    """Accepts every call and keeps nothing (wandb disabled or not installed)."""

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        return None

    def table(self, columns: list[str], rows: list[list[Any]]) -> Any:
        return None

    def finish(self) -> None:
        return None


class WandbTracker:
    def __init__(self, run: Any, wandb_module: Any) -> None:
        self.run = run
        self._wandb = wandb_module

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def table(self, columns: list[str], rows: list[list[Any]]) -> Any:
        return self._wandb.Table(columns=columns, data=rows)

    def finish(self) -> None:
        self.run.finish()


def make_tracker(
    enabled: bool,
    *,
    project: str | None,
    group: str | None,
    name: str | None,
    config: dict[str, Any],
) -> Tracker:
    """A wandb run named after the env (as the broker registered it), or a NullTracker.

    ``WANDB_MODE=offline`` works without network.
    """
    if not enabled:
        return NullTracker()
    try:
        import wandb
    except ImportError:
        logger.warning("use_wandb is set but wandb is not installed: metrics are not logged")
        return NullTracker()
    try:
        run = wandb.init(
            project=project, group=group, name=name, config=config, reinit="finish_previous"
        )
    except wandb.errors.UsageError as exc:  # no API key: nothing was sent anywhere
        logger.warning(
            "use_wandb is on (process and evaluate turn it on, as Atropos 0.4 did) but wandb "
            "cannot start (%s): metrics are not logged; run `wandb login`, set "
            "WANDB_MODE=offline, or pass --env.use_wandb false",
            exc,
        )
        return NullTracker()
    return WandbTracker(run, wandb)
