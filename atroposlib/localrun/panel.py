"""Progress of a local run: a live panel in a terminal, plain periodic lines anywhere else.

Both show the same facts, read by ``StatusPoller`` from the broker, the inference server, the
trainer's metrics file and a running evaluation's ``progress.json``: step, reward per env,
loss, tokens/s, queue depth, weight version and held-out eval progress. Every row is in every
frame; a value not known yet shows as ``-``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import httpx
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from atroposlib.envs.evaluation import read_progress
from atroposlib.localrun.components import RunLayout
from atroposlib.localrun.watch import Snapshot

UNKNOWN = "-"


@dataclass
class RunStatus:
    started_at: float = field(default_factory=time.monotonic)
    phase: str = "starting"
    broker_step: int | None = None
    queue_groups: int | None = None
    weight_version: int | None = None
    train_row: dict[str, Any] = field(default_factory=dict)
    """The trainer's latest optimizer-step row (sync rows never replace it)."""
    rewards: dict[str, float] = field(default_factory=dict)
    """Latest mean reward of each environment seen so far."""
    eval_folder: Path | None = None
    eval_progress: tuple[int, int] | None = None
    held_out: Snapshot | None = None
    """The latest held-out snapshot (before, during or after training)."""
    best_held_out: Snapshot | None = None
    warnings: list[str] = field(default_factory=list)
    """What is going wrong now (:mod:`atroposlib.localrun.watch`); empty: nothing seen."""

    def start_eval(self, phase: str, folder: Path) -> None:
        self.phase, self.eval_folder, self.eval_progress = phase, folder, None

    def end_eval(self, phase: str) -> None:
        self.phase, self.eval_folder = phase, None


def served_version(label: Any) -> int | None:
    """The served weight version as a step number: our server answers an int, vLLM a label
    (``"2"`` after the trainer's second push, ``"default"`` before any); None when it is not
    a step.

    >>> served_version(3), served_version("2"), served_version("default"), served_version(None)
    (3, 2, None, None)
    """
    if isinstance(label, bool):
        return None
    if isinstance(label, int):
        return label
    if isinstance(label, str) and label.strip().isdigit():
        return int(label)
    return None


class StatusPoller:
    """Reads the broker, the inference server, the trainer's metrics and eval progress.

    The inference server is asked at most every ``health_interval_s``: it logs each request.
    """

    def __init__(
        self,
        layout: RunLayout,
        http: httpx.Client,
        health_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.layout = layout
        self.http = http
        self.status = RunStatus()
        self.health_interval_s, self.clock = health_interval_s, clock
        self._health_at = -float("inf")
        self._metrics_offset = 0

    def poll(self, fresh_weights: bool = False) -> RunStatus:
        """The run's status; the weight version is read at most every health_interval_s,
        unless ``fresh_weights`` (the final status, which summary.json reports)."""
        status = self.status
        broker = self._get_json(f"{self.layout.broker_url}/status")
        if broker:
            status.broker_step = broker.get("current_step")
            status.queue_groups = broker.get("queue_size")
        if fresh_weights or self.clock() - self._health_at >= self.health_interval_s:
            self._health_at = self.clock()
            health = self._get_json(self.layout.inference_url + self.layout.version_path)
            if health:
                status.weight_version = served_version(health.get("weight_version"))
        for row in self._new_metric_rows():
            if "train/loss" in row:
                status.train_row = row
                status.rewards.update(
                    {k.split("/")[1]: v for k, v in row.items() if k.endswith("/reward_mean")}
                )
        if status.eval_folder is not None:
            status.eval_progress = read_progress(status.eval_folder) or status.eval_progress
        return status

    def _get_json(self, url: str) -> dict[str, Any] | None:
        try:
            response = self.http.get(url)
        except httpx.TransportError:
            return None
        try:
            data = response.json() if response.status_code == 200 else None
        except ValueError:  # vLLM's /health answers an empty body
            return None
        return data if isinstance(data, dict) else None

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


def _number(value: Any, spec: str) -> str:
    return UNKNOWN if value is None else format(value, spec)


def facts(status: RunStatus, total_steps: int) -> list[tuple[str, str]]:
    """The rows of the panel and the fields of a plain line, in order, always all of them."""
    row = status.train_row
    progress = status.eval_progress
    rewards = [(f"reward (env {env})", f"{r:.3f}") for env, r in sorted(status.rewards.items())]
    return [
        ("phase", status.phase),
        ("elapsed", f"{time.monotonic() - status.started_at:,.0f} s"),
        ("step", f"{row.get('step') or 0} / {total_steps}"),
        *(rewards or [("reward", UNKNOWN)]),
        ("loss", _number(row.get("train/loss"), ".4f")),
        ("tokens/s", _number(row.get("train/tokens_per_s"), ".0f")),
        ("queue (groups)", _number(status.queue_groups, "d")),
        ("weights", UNKNOWN if status.weight_version is None else f"v{status.weight_version}"),
        ("held-out eval", f"{progress[0]} / {progress[1]} answered" if progress else UNKNOWN),
        ("held-out strict", _held_out(status.held_out, status.best_held_out)),
        ("warning", " | ".join(status.warnings) or "none"),
    ]


def _held_out(latest: Snapshot | None, best: Snapshot | None) -> str:
    """``41.0 % at step 10 (format 98 %; best 45.0 % at step 5)``."""
    if latest is None:
        return UNKNOWN
    text = f"{100 * latest.strict:.1f} % at step {latest.step} (format {100 * latest.format:.0f} %"
    if best is not None and best is not latest:
        text += f"; best {100 * best.strict:.1f} % at step {best.step}"
    return text + ")"


def render(status: RunStatus, total_steps: int) -> Table:
    table = Table(title="atropos-local", show_header=False, min_width=60)
    table.add_column("what", style="bold")
    table.add_column("value")
    for name, value in facts(status, total_steps):
        warned = name == "warning" and bool(status.warnings)
        table.add_row(name, Text(value, style="bold red" if warned else ""))
    return table


def plain_line(status: RunStatus, total_steps: int) -> str:
    """One log line: ``phase | elapsed 12 s | step 3 / 40 | reward 0.412 | ...``."""
    parts = facts(status, total_steps)
    return " | ".join([parts[0][1], *(f"{name} {value}" for name, value in parts[1:])])


class Display(Protocol):
    def update(self, status: RunStatus) -> None: ...
    def __enter__(self) -> Display: ...
    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class _Frame:
    """Rendered afresh at every refresh, so the clock runs while a phase blocks."""

    def __init__(self, total_steps: int) -> None:
        self.status, self.total_steps = RunStatus(), total_steps

    def __rich__(self) -> Table:
        return render(self.status, self.total_steps)


class LivePanel:
    """The rich panel, redrawn in place twice a second (a terminal)."""

    def __init__(self, console: Console, total_steps: int, keep: bool = True) -> None:
        self.frame = _Frame(total_steps)
        self.live = Live(
            self.frame,
            console=console,
            refresh_per_second=2,
            transient=not keep,
            redirect_stdout=False,
        )

    def update(self, status: RunStatus) -> None:
        self.frame.status = status
        self.live.refresh()

    def __enter__(self) -> LivePanel:
        self.live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.live.__exit__(kind, exc, tb)


class PlainLines:
    """A line every ``interval_s`` and at every phase change (logs, CI, ``tee``, nohup)."""

    def __init__(
        self,
        write: Callable[[str], None],
        total_steps: int,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write, self.total_steps, self.interval_s, self.clock = (
            write,
            total_steps,
            interval_s,
            clock,
        )
        self._last_at = -float("inf")
        self._last_phase: str | None = None
        self._last_warnings: list[str] = []

    def update(self, status: RunStatus) -> None:
        """A line now if the phase or the warnings changed, else once per interval."""
        now = self.clock()
        changed = status.phase != self._last_phase or status.warnings != self._last_warnings
        if changed or now - self._last_at >= self.interval_s:
            self.write(plain_line(status, self.total_steps))
            self._last_at, self._last_phase = now, status.phase
            self._last_warnings = list(status.warnings)

    def __enter__(self) -> PlainLines:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Nothing to tear down: every line is already written."""
