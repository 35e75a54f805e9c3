"""The sweep before the grid (issue 46): the same small grid of settings for both systems,
chosen on the validation set only.

For one task and the sweep's seed, runs each system in two stages: first every learning rate
at the system's own temperature (ours: lr x4 around its default at 0.7; TRL: lr x4 from its
default 1e-6 at 1.0, both at its defaults and at ours' other knobs), then the other temperature
at the best rate of each (``first_stage``, ``second_stage``; ``--full-grid``: every lr x
temperature instead). One run at a time, each for ``--minutes`` (10), exactly as a grid cell
trains it (``learning_vs_trl.train_system``: ours with its drop warning on), then its final
weights graded greedily on the seed's VALIDATION set. The test sets are never read. One JSON
line per finished run goes to ``<out>/sweep.jsonl``; run again, it skips the settings already
there (an interrupted sweep resumes). At the end, and with ``--table-only`` at any time, it
prints the table and each system's chosen setting (best validation strict over all its runs;
ties: the default), which ``learning_vs_trl.py --settings-from <out>/sweep.jsonl`` runs on the
grid.

    .venv/bin/python benchmarks/learning_sweep.py --tasks sums      # 15 runs, ~3 h per task
    .venv/bin/python benchmarks/learning_sweep.py --table-only
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.utils.test_model import ensure_test_model
from benchmarks.learning_settings import (
    OURS_LRS,
    TEMPERATURES,
    TRL_LRS,
    Setting,
    chosen,
    first_stage,
    read_rows,
    row_for,
    second_stage,
    sweep_grid,
)
from benchmarks.learning_systems import SWEEP_SEED, TASKS, Snapshot, Task
from benchmarks.learning_vs_trl import GRADES, evaluate, pct, train_system

OUT = Path("docs") / "learning-vs-trl" / "sweep"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="sums", help=f"Tasks to sweep ({', '.join(TASKS)}).")
    parser.add_argument("--seed", type=int, default=SWEEP_SEED, help="Run seed of the sweep.")
    parser.add_argument("--minutes", type=float, default=10.0, help="Budget of each run.")
    parser.add_argument(
        "--out",
        type=Path,
        default=OUT,
        help="Where sweep.jsonl (one line per finished run) and sweep.txt (the table) go.",
    )
    parser.add_argument(
        "--run-root",
        type=Path,
        default=Path("runs") / "learning-sweep",
        help="Each run's folder: <run-root>/<task>-seed<N>/<setting> (its weights deleted "
        "once graded).",
    )
    parser.add_argument("--ours-lrs", default=",".join(f"{v:g}" for v in OURS_LRS))
    parser.add_argument("--trl-lrs", default=",".join(f"{v:g}" for v in TRL_LRS))
    parser.add_argument(
        "--temperatures",
        default=",".join(f"{v:g}" for v in TEMPERATURES),
        help="Temperatures of the second stage (with --full-grid: of the whole cross).",
    )
    parser.add_argument(
        "--full-grid",
        action="store_true",
        help="Every lr x temperature (TRL: x knobs) instead of the two stages.",
    )
    parser.add_argument(
        "--drop-check-every-steps",
        type=int,
        default=15,
        help="Ours' held-out drop warning on the validation set, as the grid runs it (0: off).",
    )
    parser.add_argument("--trl-threads", type=int, default=2, help="Torch threads of TRL.")
    parser.add_argument("--eval-threads", type=int, default=2, help="Threads of the grader.")
    parser.add_argument(
        "--table-only", action="store_true", help="Run nothing: the table and the choice so far."
    )
    args = parser.parse_args(argv)
    args.points, args.ours_arg, args.trl_config = 1, [], []  # train_system reads these
    return args


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v.strip()]


def sweep_task(args: argparse.Namespace, name: str, base_model: Path) -> None:
    """Every setting of the sweep not yet in sweep.jsonl, one after the other: the first
    stage, then the second chosen from it (``--full-grid``: the whole cross)."""
    path = args.out / "sweep.jsonl"
    task = Task.load(TASKS[name], args.seed)
    task_args = argparse.Namespace(**{**vars(args), "env_config": TASKS[name]})
    base_dir = args.run_root / f"{name}-seed{args.seed}"
    base = evaluate(task, None, base_model, base_dir / "eval", args.eval_threads, "validation")
    for stage in ("whole grid",) if args.full_grid else ("first", "second"):
        rows = finished_rows(args, path, name)
        settings = stage_settings(args, stage, rows, name)
        done = {row["key"] for row in rows}
        todo = [s for s in settings if s.key not in done]
        print(f"[{name}] {stage} stage: {len(settings) - len(todo)} of {len(settings)} settings "
              f"done; {len(todo)} to run, {args.minutes:g} min each", flush=True)  # fmt: skip
        for setting in todo:
            started = time.monotonic()
            figures = run_setting(task_args, task, setting, base_dir / setting.slug, base_model)
            if figures is None:
                print(f"[{name}] {setting.key} failed; see {base_dir / setting.slug}", flush=True)
                continue
            figures["base_validation"] = {g: base.rate(g) for g in GRADES}
            figures["wall_minutes"] = (time.monotonic() - started) / 60
            with path.open("a") as handle:
                handle.write(row_for(setting, name, args.seed, args.minutes, **figures))
            print(f"[{name}] {setting.key}: validation strict "
                  f"{pct(figures['validation']['strict'])}", flush=True)  # fmt: skip


def stage_settings(
    args: argparse.Namespace, stage: str, rows: list[dict[str, Any]], name: str
) -> list[Setting]:
    """The settings of one stage; the second is chosen from the first stage's ``rows``."""
    ours_lrs, trl_lrs = floats(args.ours_lrs), floats(args.trl_lrs)
    temperatures = floats(args.temperatures)
    if stage == "first":
        return first_stage(ours_lrs, trl_lrs)
    if stage == "second":
        return second_stage(rows, name, temperatures)
    return sweep_grid(ours_lrs, trl_lrs, temperatures)


def finished_rows(args: argparse.Namespace, path: Path, name: str) -> list[dict[str, Any]]:
    """The sweep's rows of this task, seed and budget."""
    return [r for r in read_rows(path)
            if (r["task"], r["seed"], r["minutes"]) == (name, args.seed, args.minutes)]  # fmt: skip


def run_setting(
    args: argparse.Namespace, task: Task, setting: Setting, run_dir: Path, base_model: Path
) -> dict[str, Any] | None:
    """One run at ``setting``, its final weights graded on the validation set; the weights
    are deleted afterwards (a sweep of 24 runs would keep ~13 GB)."""
    if run_dir.exists():  # an earlier, unfinished attempt
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    record = train_system(setting.system, setting, args, task, run_dir, base_model, [])
    if record is None or not record["snapshots"]:
        return None
    last = record["snapshots"][-1]
    final = Snapshot(**{**last, "folder": Path(last["folder"])})
    graded = evaluate(task, final, base_model, run_dir / "eval", args.eval_threads, "validation")
    for folder in ("checkpoints", "snapshots"):
        shutil.rmtree(run_dir / setting.system / folder, ignore_errors=True)
    training = record["training"]
    return {
        "validation": {g: graded.rate(g) for g in GRADES},
        "steps": training["steps"],
        "training_minutes": training["elapsed_s"] / 60,
        "drop_warnings": len(training.get("drop_check", {}).get("warnings", [])),
        "load": record["load"],
    }


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """Every finished run per task, best first, and each system's choice."""
    lines = [
        "learning_sweep: validation strict accuracy (greedy) of each setting's final weights",
        "",
        "| task | system | knobs | lr | T | steps | validation strict | lenient | format |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    tasks = sorted({r["task"] for r in rows})
    for task in tasks:
        ranked = sorted(
            (r for r in rows if r["task"] == task),
            key=lambda r: (r["setting"]["system"], -r["validation"]["strict"]),
        )
        for row in ranked:
            s, v = row["setting"], row["validation"]
            lines.append(f"| {task} | {s['system']} | {s['knobs']} | {s['lr']:g} | "
                         f"{s['temperature']:g} | {row['steps']} | {pct(v['strict'])} | "
                         f"{pct(v['lenient'])} | {pct(v['formatted'])} |")  # fmt: skip
    lines.append("")
    for task in tasks:
        picks = chosen(rows, task)
        lines.append(f"{task}: chosen " + "; ".join(
            _choice(setting) for _, setting in sorted(picks.items())))  # fmt: skip
    return "\n".join(lines)


def _choice(setting: Setting) -> str:
    """E.g. ``trl at ours' knobs lr=1e-05 T=1``; ours always runs at its own knobs."""
    knobs = "" if setting.system == "ours" else (
        " at its default knobs" if setting.knobs == "defaults" else " at ours' knobs")  # fmt: skip
    default = " (its default)" if setting.is_default else ""
    return f"{setting.system}{knobs} lr={setting.lr:g} T={setting.temperature:g}{default}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.table_only:
        base_model = ensure_test_model()
        for name in args.tasks.split(","):
            sweep_task(args, name, base_model)
    rows = read_rows(args.out / "sweep.jsonl")
    if not rows:
        print(f"no finished run in {args.out / 'sweep.jsonl'}")
        return 1
    table = sweep_table(rows)
    print(table)
    (args.out / "sweep.txt").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
