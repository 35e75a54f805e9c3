"""Held-out evaluation while the trainer steps, the best weights kept, the warnings raised.

Every ``--eval-every-steps N`` trainer steps, ``env.py evaluate`` answers the held-out
problems greedily against the weights the inference server serves at that moment, as its own
process: the trainer never waits for it (the server decodes its requests beside the
rollouts'). The served weights folder (``checkpoints/weights/step-V``) is hard-linked when the
evaluation starts, so the trainer may prune it meanwhile; if the evaluation is the best so far
by strict accuracy, those links become ``checkpoints/best`` (with ``held_out.json``). The
evaluations before and after training are snapshots too (step 0: the base model).

Each refresh also reads the groups the env wrote (``rollouts.jsonl``, dropped ones marked) and
sets the run's warnings (:mod:`atroposlib.localrun.watch`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from atroposlib.envs.groups import is_over_budget
from atroposlib.launcher import Supervisor
from atroposlib.localrun import components
from atroposlib.localrun.layout import RunLayout
from atroposlib.localrun.panel import StatusPoller
from atroposlib.localrun.settings import LocalRunSettings
from atroposlib.localrun.watch import (
    Snapshot,
    accuracy_warning,
    best_snapshot,
    dropped_groups_warning,
    failing_groups,
    over_budget_warning,
)

logger = logging.getLogger(__name__)
BEST = "best"


@dataclass(frozen=True)
class _Pending:
    name: str
    folder: Path
    step: int
    weight_version: int | None
    weights: Path | None


class GroupFlags:
    """Per group the env wrote to ``rollouts.jsonl``: (dropped without signal?, mean reward),
    and in ``over_budget`` its longest sequence when it was not sent for being too long
    (else 0)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.groups: list[tuple[bool, float]] = []
        self.over_budget: list[int] = []
        self._offset = 0

    def read(self) -> list[tuple[bool, float]]:
        if self.path.exists():
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                complete, _, _ = handle.read().rpartition(b"\n")
            if complete:
                self._offset += len(complete) + 1
                lines = [json.loads(line) for line in complete.split(b"\n") if line.strip()]
                for group in lines:
                    too_long = is_over_budget(str(group.get("dropped") or ""))
                    no_signal = bool(group.get("dropped")) and not too_long
                    self.groups.append((no_signal, _mean(group.get("scores"))))
                    self.over_budget.append(_longest(group.get("tokens")) if too_long else 0)
        return self.groups


def _mean(scores: Any) -> float:
    return sum(scores) / len(scores) if scores else 0.0


def _longest(tokens: Any) -> int:
    return max((len(seq) for seq in tokens or []), default=0)


class RunWatch:
    """Starts and collects the periodic evaluations; keeps snapshots, best and warnings."""

    def __init__(
        self,
        settings: LocalRunSettings,
        layout: RunLayout,
        supervisor: Supervisor,
        poller: StatusPoller,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.layout = settings, layout
        self.supervisor, self.poller, self.clock = supervisor, poller, clock
        self.snapshots: list[Snapshot] = []
        self.best_weights: Path | None = None
        self.warnings_raised: list[dict[str, Any]] = []
        self.pending: _Pending | None = None
        self.groups = GroupFlags(layout.rollouts_file)
        self.training = True
        """Evaluations start only while the trainer runs (:meth:`end_training`)."""
        self._last_started = 0
        self._active: dict[str, str] = {}
        """The warnings raised that still hold, by kind, as raised."""

    def tick(self) -> None:
        """Collect a finished evaluation, start a due one, refresh the warnings."""
        self._collect()
        step = self._trainer_step()
        every = self.settings.eval_every_steps
        due = every and self._last_started + every <= step < self.settings.steps
        if due and self.training and self.pending is None:  # the last step: the eval after
            self._start(step)
        self._refresh_warnings(step)

    def end_training(self) -> None:
        """The trainer is done: start no more evaluations (the one running may end)."""
        self.training = False

    def reuse_for_after(self, weight_version: int | None) -> bool:
        """Copy the last evaluation during training to ``eval_after/`` when it graded these
        final weights (versions only grow: nothing changed while it ran), instead of a second
        pass over the same weights."""
        last = self.snapshots[-1] if self.snapshots else None
        if weight_version is None or last is None or last.step == 0:
            return False
        if last.weight_version != weight_version:
            return False
        shutil.copytree(self.layout.eval_dir(f"step{last.step}"), self.layout.eval_dir("after"))
        logger.info("the evaluation at step %d graded the final weights: it is the one after "
                    "training", last.step)  # fmt: skip
        return True

    def record(self, folder: Path, step: int, weight_version: int | None) -> Snapshot | None:
        """Add the evaluation in ``folder`` (before/after training) as a snapshot."""
        weights = self._link_served(weight_version, f".held-out-{folder.name}")
        return self._add(folder, step, weight_version, weights)

    def summary(self) -> dict[str, Any]:
        best = best_snapshot(self.snapshots)
        if best is None or self.best_weights is not None:
            weights = str(self.best_weights)
        elif best.weight_version:
            weights = f"not kept: no folder checkpoints/weights/step-{best.weight_version}"
        else:
            weights = f"the base model ({self.layout.model})"
        return {
            "held_out_snapshots": [asdict(s) for s in self.snapshots],
            "best_held_out": None if best is None else {**asdict(best), "weights": weights},
            "warnings": list(self.poller.status.warnings),
            "warnings_raised": self.warnings_raised,
        }  # fmt: skip

    def _start(self, step: int) -> None:
        version = self.poller.poll(fresh_weights=True).weight_version
        label = f"step{step}"
        component = components.evaluation(self.layout, self.settings, label)
        weights = self._link_served(version, f".held-out-{label}")
        self.supervisor.start(component)
        self.pending = _Pending(component.name, self.layout.eval_dir(label), step, version, weights)
        status = self.poller.status  # its progress on the display, the phase stays "training"
        status.eval_folder, status.eval_progress = self.pending.folder, None
        self._last_started = step
        logger.info("held-out evaluation at step %d (weights v%s) started", step, version)

    def _collect(self) -> None:
        pending = self.pending
        if pending is None:
            return
        code = self.supervisor.returncode(pending.name)
        if code is None:
            return
        self.pending = None
        self.poller.status.eval_folder = None
        if code != 0:
            logger.warning(
                "%s exited with code %d (the run goes on):\n%s",
                pending.name, code, self.supervisor.log_tail(pending.name),
            )  # fmt: skip
            _remove(pending.weights)
            return
        self._add(pending.folder, pending.step, pending.weight_version, pending.weights)

    def _add(
        self, folder: Path, step: int, weight_version: int | None, weights: Path | None
    ) -> Snapshot | None:
        snapshot = read_snapshot(folder, step, weight_version)
        if snapshot is None:
            _remove(weights)
            return None
        previous = best_snapshot(self.snapshots)
        self.snapshots.append(snapshot)
        if previous is None or snapshot.strict > previous.strict:
            self._keep_best(snapshot, weights)
        else:
            _remove(weights)
        status = self.poller.status
        status.held_out, status.best_held_out = snapshot, best_snapshot(self.snapshots)
        return snapshot

    def _keep_best(self, snapshot: Snapshot, weights: Path | None) -> None:
        best = self.layout.checkpoints / BEST
        shutil.rmtree(best, ignore_errors=True)
        self.best_weights = None
        if weights is None:
            return
        weights.rename(best)
        (best / "held_out.json").write_text(json.dumps(asdict(snapshot), indent=2))
        self.best_weights = best

    def _link_served(self, version: int | None, name: str) -> Path | None:
        """Hard links to the pushed weights of ``version`` (None: not pushed, the base model)."""
        source = self.layout.checkpoints / "weights" / f"step-{version}"
        if not version or not source.is_dir():
            return None
        target = self.layout.checkpoints / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for path in source.iterdir():
            if path.is_file():
                try:
                    os.link(path, target / path.name)
                except OSError:
                    shutil.copy2(path, target / path.name)
        return target

    def _trainer_step(self) -> int:
        return int(self.poller.status.train_row.get("step") or 0)

    def _refresh_warnings(self, step: int) -> None:
        """Each kind of warning is raised (logged, recorded) when it starts and kept as raised
        while it holds: the dropped share moves with every group, which is no news. A new
        held-out snapshot that still warns is news."""
        settings = self.settings
        dropped = failing_groups(self.groups.read())
        fresh = {
            "held_out": accuracy_warning(self.snapshots, settings.eval_drop_warning),
            "dropped_groups": dropped_groups_warning(dropped, settings.dropped_groups_warning),
            "over_budget": over_budget_warning(self.groups.over_budget, settings.max_token_len),
        }
        for kind, text in fresh.items():
            if text is None:
                self._active.pop(kind, None)
            elif kind not in self._active or (kind == "held_out" and self._active[kind] != text):
                self._active[kind] = text
                self.warnings_raised.append({"step": step, "warning": text})
                logger.warning("step %d: %s", step, text)
        self.poller.status.warnings = list(self._active.values())


def read_snapshot(folder: Path, step: int, weight_version: int | None) -> Snapshot | None:
    """The strict/lenient/format accuracy ``env.py evaluate`` wrote to ``folder``."""
    try:
        written = json.loads((folder / "metrics.json").read_text())
        metrics = written["results"]["all"]
        seconds = float(written["config_general"]["total_evaluation_time_seconds"])
        return Snapshot(step, weight_version, float(metrics["eval/strict"]),
                        float(metrics["eval/lenient"]), float(metrics["eval/formatted"]),
                        round(seconds, 1))  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        logger.warning("no held-out metrics in %s: not a snapshot", folder)
        return None


def _remove(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
