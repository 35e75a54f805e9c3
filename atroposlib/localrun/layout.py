"""Where a local run's processes listen and write."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunLayout:
    """Where a run's parts listen and write."""

    run_dir: Path
    model: str
    broker_port: int
    inference_port: int
    version_path: str = "/health"
    """The inference server's route answering ``{"weight_version": ...}``."""

    @property
    def broker_url(self) -> str:
        return f"http://127.0.0.1:{self.broker_port}"

    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.inference_port}"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def metrics_file(self) -> Path:
        return self.run_dir / "metrics.jsonl"

    @property
    def rollouts_file(self) -> Path:
        return self.run_dir / "rollouts.jsonl"

    def eval_dir(self, label: str) -> Path:
        return self.run_dir / f"eval_{label}"
