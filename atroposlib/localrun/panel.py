"""The live terminal panel of a local run: step, reward, queue, tokens/s, weight version."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from atroposlib.localrun.components import RunLayout


@dataclass
class RunStatus:
    started_at: float = field(default_factory=time.monotonic)
    broker_step: int | None = None
    queue_groups: int | None = None
    weight_version: int | None = None
    trainer_row: dict[str, Any] = field(default_factory=dict)
    trainer_rows: int = 0
    phase: str = "starting"


class StatusPoller:
    """Reads the broker, the inference server and the trainer's metrics file."""

    def __init__(self, layout: RunLayout, http: httpx.Client) -> None:
        self.layout = layout
        self.http = http
        self.status = RunStatus()
        self._metrics_offset = 0

    def poll(self) -> RunStatus:
        status = self.status
        broker = self._get_json(f"{self.layout.broker_url}/status")
        if broker:
            status.broker_step = broker.get("current_step")
            status.queue_groups = broker.get("queue_size")
        health = self._get_json(f"{self.layout.inference_url}/health")
        if health:
            status.weight_version = health.get("weight_version")
        for row in self._new_metric_rows():
            status.trainer_row = row
            status.trainer_rows += 1
        return status

    def _get_json(self, url: str) -> dict[str, Any] | None:
        try:
            response = self.http.get(url)
        except httpx.TransportError:
            return None
        return response.json() if response.status_code == 200 else None

    def _new_metric_rows(self) -> list[dict[str, Any]]:
        path: Path = self.layout.metrics_file
        if not path.exists():
            return []
        with path.open() as handle:
            handle.seek(self._metrics_offset)
            text = handle.read()
        complete, _, _ = text.rpartition("\n")
        if not complete:
            return []
        self._metrics_offset += len(complete.encode()) + 1
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def render(status: RunStatus, total_steps: int) -> Table:
    row = status.trainer_row
    rewards = {k.split("/")[1]: v for k, v in row.items() if k.endswith("/reward_mean")}
    table = Table(title="atropos-local", show_header=False, min_width=60)
    table.add_column("what", style="bold")
    table.add_column("value")
    table.add_row("phase", status.phase)
    table.add_row("elapsed", f"{time.monotonic() - status.started_at:,.0f} s")
    table.add_row("trainer step", f"{row.get('step', 0)} / {total_steps}")
    table.add_row("broker step / queued groups", f"{status.broker_step} / {status.queue_groups}")
    for env, reward in sorted(rewards.items()):
        table.add_row(f"reward (env {env})", f"{reward:.3f}")
    if "train/loss" in row:
        table.add_row("loss", f"{row['train/loss']:.4f}")
    if "train/tokens_per_s" in row:
        table.add_row("trainer tokens/s", f"{row['train/tokens_per_s']:.0f}")
    table.add_row("inference weight version", str(status.weight_version))
    return table
