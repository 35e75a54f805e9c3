"""What the sweep varies and the grid runs: one system's learning settings, and the choice.

A ``Setting`` is one system at one learning rate and sampling temperature; TRL's also names
its other knobs, either TRL's documented defaults (8 replies a prompt, 8 sequences a step,
clip 0.2) or ours' (4 replies a prompt, 16 sequences a step, clip-higher 0.28). The sweep
(``learning_sweep.py``) appends one JSON line per finished run; ``chosen`` reads them back and
picks, per task and system, the best validation strict accuracy (ties: the default), which
``learning_vs_trl.py --settings-from`` then runs on the grid. The sweep runs in two stages
(``first_stage``: the learning rates at each system's own temperature; ``second_stage``: the
other temperature at each one's best rate), or the whole cross with ``sweep_grid``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

OURS_LR = 1e-5
"""atropos-local's default --lr (LocalRunSettings.lr)."""
OURS_TEMPERATURE = 0.7
"""The env configs' sampling temperature (configs/local-cpu-*-env.yaml)."""
TRL_LR = 1e-6
TRL_TEMPERATURE = 1.0
"""TRL 1.16's documented GRPOConfig defaults (a test keeps them)."""
OURS_LRS = (3e-6, 6e-6, 1e-5, 2e-5)
TRL_LRS = (1e-6, 3e-6, 1e-5, 2e-5)
TEMPERATURES = (0.7, 1.0)
KNOBS = ("defaults", "ours")
OURS_KNOBS_FOR_TRL: dict[str, Any] = {
    "num_generations": 4,  # atropos-local --group-size
    "per_device_train_batch_size": 16,  # --batch-size: 4 prompts x 4 replies a step
    "epsilon_high": 0.28,  # configs/local-cpu-trainer.yaml loss.clip_eps_high
}
"""TRL's GRPOConfig at ours' other knobs (besides lr and temperature, which are swept)."""


@dataclass(frozen=True)
class Setting:
    """One system at one learning rate and temperature (TRL: and one set of other knobs)."""

    system: str
    lr: float
    temperature: float
    knobs: str = "ours"

    def __post_init__(self) -> None:
        if self.system not in ("ours", "trl") or self.knobs not in KNOBS:
            raise ValueError(f"{self}: system ours or trl, knobs one of {KNOBS}")
        if self.system == "ours" and self.knobs != "ours":
            raise ValueError("ours has only its own knobs (knobs='ours')")

    @property
    def key(self) -> str:
        """E.g. ``trl defaults lr=1e-06 T=1`` (one per setting, stable across runs)."""
        return f"{self.system} {self.knobs} lr={self.lr:g} T={self.temperature:g}"

    @property
    def slug(self) -> str:
        """The key as a folder name."""
        return self.key.replace(" ", "_").replace("=", "")

    @property
    def is_default(self) -> bool:
        if self.system == "ours":
            return (self.lr, self.temperature) == (OURS_LR, OURS_TEMPERATURE)
        return (self.knobs, self.lr, self.temperature) == ("defaults", TRL_LR, TRL_TEMPERATURE)

    def ours_args(self) -> list[str]:
        """atropos-local flags (ours only)."""
        return ["--lr", f"{self.lr:g}"]

    def env_flags(self) -> list[str]:
        """env.py flags: the sampling temperature of ours' rollouts."""
        return ["--env.temperature", f"{self.temperature:g}"]

    def trl_overrides(self) -> dict[str, Any]:
        """GRPOConfig settings over TRL's defaults (TRL only)."""
        knobs = OURS_KNOBS_FOR_TRL if self.knobs == "ours" else {}
        return {"learning_rate": self.lr, "temperature": self.temperature, **knobs}


DEFAULTS = {
    "ours": Setting("ours", OURS_LR, OURS_TEMPERATURE),
    "trl": Setting("trl", TRL_LR, TRL_TEMPERATURE, "defaults"),
}
"""Each system's setting before any tuning (issue 35's grid ran these)."""


def sweep_grid(
    ours_lrs: Sequence[float] = OURS_LRS,
    trl_lrs: Sequence[float] = TRL_LRS,
    temperatures: Sequence[float] = TEMPERATURES,
) -> list[Setting]:
    """Ours: lr x temperature; TRL: lr x {its defaults, ours' knobs} x temperature; each
    system's default first (so an interrupted sweep has both defaults).

    >>> [s.key for s in sweep_grid([1e-5], [1e-6], [0.7])]
    ['ours ours lr=1e-05 T=0.7', 'trl defaults lr=1e-06 T=0.7', 'trl ours lr=1e-06 T=0.7']
    """
    ours = [Setting("ours", lr, t) for lr in ours_lrs for t in temperatures]
    trl = [Setting("trl", lr, t, k) for k in KNOBS for lr in trl_lrs for t in temperatures]
    return defaults_first(ours) + defaults_first(trl)


def defaults_first(settings: list[Setting]) -> list[Setting]:
    """``settings`` with the system's default first (so an interrupted sweep has it)."""
    return sorted(settings, key=lambda s: not s.is_default)


def first_stage(
    ours_lrs: Sequence[float] = OURS_LRS, trl_lrs: Sequence[float] = TRL_LRS
) -> list[Setting]:
    """The two-stage sweep's first stage: every learning rate at the system's own default
    temperature (TRL: at both sets of knobs); each system's default first.

    >>> [s.key for s in first_stage([1e-5], [1e-6])]
    ['ours ours lr=1e-05 T=0.7', 'trl defaults lr=1e-06 T=1', 'trl ours lr=1e-06 T=1']
    """
    ours = [Setting("ours", lr, OURS_TEMPERATURE) for lr in ours_lrs]
    trl = [Setting("trl", lr, TRL_TEMPERATURE, k) for k in KNOBS for lr in trl_lrs]
    return defaults_first(ours) + defaults_first(trl)


def second_stage(
    rows: Iterable[dict[str, Any]], task: str, temperatures: Sequence[float] = TEMPERATURES
) -> list[Setting]:
    """The second stage: the other temperatures at the best first-stage learning rate of each
    system and set of knobs (best validation strict; ties: the default, else the first)."""

    def at_own_temperature(setting: Setting) -> tuple[str, str] | None:
        if setting.temperature != DEFAULTS[setting.system].temperature:
            return None
        return setting.system, setting.knobs

    return [
        Setting(s.system, s.lr, t, s.knobs)
        for s in best_of(rows, task, at_own_temperature).values()
        for t in temperatures
        if t != s.temperature
    ]


def setting_of(row: dict[str, Any]) -> Setting:
    return Setting(**row["setting"])


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The sweep's JSON lines (a line cut off by an interruption is skipped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def row_for(setting: Setting, task: str, seed: int, minutes: float, **figures: Any) -> str:
    """One JSON line of the sweep."""
    row = {"task": task, "seed": seed, "minutes": minutes, "key": setting.key,
           "setting": asdict(setting), **figures}  # fmt: skip
    return json.dumps(row) + "\n"


def chosen(rows: Iterable[dict[str, Any]], task: str) -> dict[str, Setting]:
    """Per system, the setting with the best validation strict accuracy on ``task`` (ties:
    the system's default, else the first of them in the sweep's order)."""
    return best_of(rows, task, lambda setting: setting.system)


def best_of(
    rows: Iterable[dict[str, Any]], task: str, group: Callable[[Setting], Hashable | None]
) -> dict[Any, Setting]:
    """Per ``group`` of the settings run on ``task`` (None: left out), the one with the best
    validation strict accuracy (ties: the default, else the first in the sweep's order)."""
    best: dict[Any, tuple[float, bool, Setting]] = {}
    for row in rows:
        setting = setting_of(row)
        key = group(setting) if row["task"] == task else None
        if key is None:
            continue
        rank = (float(row["validation"]["strict"]), setting.is_default)
        held = best.get(key)
        if held is None or rank > held[:2]:
            best[key] = (*rank, setting)
    return {key: setting for key, (_, _, setting) in best.items()}


def settings_for(path: Path | None, task: str) -> dict[str, Setting]:
    """What the grid runs on ``task``: the sweep's choice in ``path`` (None: the defaults)."""
    if path is None:
        return dict(DEFAULTS)
    picked = chosen(read_rows(path), task)
    missing = [system for system in DEFAULTS if system not in picked]
    if missing:
        raise SystemExit(f"{path}: no finished sweep run of {', '.join(missing)} on {task}; "
                         "run benchmarks/learning_sweep.py for it first")  # fmt: skip
    return picked
