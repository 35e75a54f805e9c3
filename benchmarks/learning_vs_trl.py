"""Does our loop learn, and better than TRL? Held-out greedy accuracy, side by side, one command.

Runs, one after the other on this machine, (a) our full loop as ``scripts/demo`` runs it
(``atropos-local``: broker + embedded inference + reasoning-gym env + GRPO trainer, its
defaults) and (b) TRL's ``GRPOTrainer`` with its documented defaults, on the same model
(the offline SmolLM2-135M-Instruct), task, prompt, reward function, loss family (Dr GRPO),
wall-clock budget and seed. Each system's weights are kept at a few moments of its run and
evaluated afterwards (off the budget) by one evaluator: greedy replies to the same held-out
problems, none of which either system can train on (checked at start), graded strict (exact
``<answer>N</answer>`` and right), lenient (right at all) and for format.

    .venv/bin/python benchmarks/learning_vs_trl.py     # 20 min each + ~22 min eval: ~63 min
    .venv/bin/python benchmarks/learning_vs_trl.py --minutes 5 --seed 1
    .venv/bin/python benchmarks/learning_vs_trl.py --run-dir DIR --eval-only   # (re)evaluate

Writes ``runs/learning-vs-trl-<date>-<time>/``: ``table.txt`` (what it prints),
``summary.json``, ``accuracy_vs_minutes.png``, per-problem ``eval/*.jsonl``, each system's
``*-training.json`` (figures, load, snapshots) and logs.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.cli.local import parse_settings
from atroposlib.localrun import report
from atroposlib.localrun.bootstrap import Interval, bootstrap_mean, gain_difference, gains
from atroposlib.utils.test_model import ensure_test_model
from benchmarks.learning_pool import pooled_table
from benchmarks.learning_systems import (
    TASKS,
    LoadSampler,
    Snapshot,
    Task,
    TrlSpec,
    greedy_replies,
    run_ours,
    run_trl,
    trl_snapshots,
)

SYSTEMS = ("ours", "trl")
GRADES = ("strict", "lenient", "formatted")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="Budget of each system.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of both systems and the data.")
    parser.add_argument("--points", type=int, default=4, help="Evaluated moments per system.")
    parser.add_argument("--run-dir", type=Path, default=None, help="Output folder.")
    parser.add_argument(
        "--tasks",
        default=",".join(TASKS),
        help=f"Tasks to run, one after the other (of {', '.join(TASKS)}).",
    )
    parser.add_argument(
        "--env-config", type=Path, default=None, help="Instead of --tasks: one task (env YAML)."
    )
    parser.add_argument("--only", choices=SYSTEMS, default=None, help="Run one system only.")
    parser.add_argument("--trl-threads", type=int, default=2, help="Torch threads of TRL.")
    parser.add_argument(
        "--trl-config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="Override a GRPOConfig setting of TRL (e.g. learning_rate=1e-5); default none.",
    )
    parser.add_argument(
        "--ours-arg", action="append", default=[], help="Extra atropos-local flag (repeat)."
    )
    parser.add_argument("--eval-batch", type=int, default=50, help="Prompts per greedy batch.")
    parser.add_argument(
        "--eval-threads",
        type=int,
        default=1,
        help="Torch threads of the evaluator (on a loaded 2-core machine 1 is the fastest).",
    )
    parser.add_argument(
        "--eval-only",
        action="store_true",
        help="Train nothing: evaluate the systems already trained in --run-dir (an evaluation "
        "that was cut off resumes; models already graded are read back).",
    )
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------
# Held-out results, per problem
# ---------------------------------------------------------------------------------------


@dataclass
class Evaluated:
    label: str
    elapsed_s: float
    step: int
    grades: dict[str, list[bool]]  # grade -> one bool per held-out problem, in task order

    def rate(self, grade: str) -> float:
        values = self.grades[grade]
        return sum(values) / len(values)


def evaluate(
    task: Task, snapshot: Snapshot | None, base: Path, out: Path, batch: int, threads: int
) -> Evaluated:
    """Greedy replies of ``snapshot`` (None: the base model) to every held-out problem; a model
    already graded in ``out`` is read back."""
    label = f"{snapshot.system}-step-{snapshot.step}" if snapshot else "base"
    elapsed, step = (snapshot.elapsed_s, snapshot.step) if snapshot else (0.0, 0)
    path = out / f"{label}.jsonl"
    if path.exists():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        if [r["problem"] for r in rows] == [task.key(e) for e in task.held_out]:
            return Evaluated(label, elapsed, step, {g: [r[g] for r in rows] for g in GRADES})
    replies = greedy_replies(
        snapshot.folder if snapshot else base,
        base,
        [task.prompt(e) for e in task.held_out],
        task.max_tokens,
        batch,
        threads,
    )
    graded = [task.grade(reply, entry) for reply, entry in zip(replies, task.held_out, strict=True)]
    with path.open("w") as handle:
        for entry, reply, grade in zip(task.held_out, replies, graded, strict=True):
            row = {
                "problem": task.key(entry),
                "question": entry["question"],
                "answer": entry["answer"],
                "response": reply,
                "strict": grade.strict,
                "lenient": grade.lenient,
                "formatted": grade.formatted,
            }
            handle.write(json.dumps(row) + "\n")
    return Evaluated(label, elapsed, step, {g: [getattr(x, g) for x in graded] for g in GRADES})


# ---------------------------------------------------------------------------------------
# Training-side figures of each system
# ---------------------------------------------------------------------------------------


def ours_training(run_dir: Path, task: Task, batch_size: int) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/loss" in r]
    elapsed = steps[-1]["train/elapsed_s"] if steps else 0.0
    samples = len(steps) * batch_size  # every step takes exactly batch_size sequences
    return {
        "steps": len(steps),
        "elapsed_s": elapsed,
        "samples": samples,
        "samples_per_s": samples / elapsed if elapsed else 0.0,
        "reward_per_step": [
            r.reward
            for r in report.rewards_by_step(
                run_dir / "rollouts.jsonl", task.config.format_weight, task.config.partial_format
            )
        ],
        "zero_variance_groups": sum(r.get("train/zero_variance_groups", 0) for r in steps),
    }


def trl_training(out_dir: Path) -> dict[str, Any]:
    result = json.loads((out_dir / "result.json").read_text())
    return {
        "steps": result["steps"],
        "elapsed_s": result["elapsed_s"],
        "samples": result["samples"],
        "samples_per_s": result["samples"] / result["elapsed_s"] if result["elapsed_s"] else 0,
        "reward_per_step": [r["reward"] for r in result["rewards"]],
        "settings": result["settings"],
    }


def first_last(values: list[float], window: int = 5) -> tuple[float, float] | None:
    if len(values) < 2 * window:
        return None
    return sum(values[:window]) / window, sum(values[-window:]) / window


# ---------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------


def flips(before: list[bool], after: list[bool]) -> str:
    right_to_wrong = sum(a and not b for a, b in zip(before, after, strict=True))
    wrong_to_right = sum(b and not a for a, b in zip(before, after, strict=True))
    return f"r->w {right_to_wrong}, w->r {wrong_to_right}"


def pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def system_rows(
    name: str, training: dict[str, Any], base: Evaluated, final: Evaluated, load: dict[str, float]
) -> list[tuple[str, str]]:
    reward = first_last(training["reward_per_step"])
    rows = [
        ("steps done", f"{training['steps']}"),
        ("samples trained (per s)", f"{training['samples']} ({training['samples_per_s']:.2f}/s)"),
        ("training minutes", f"{training['elapsed_s'] / 60:.1f}"),
        ("load average (mean / max)", f"{load['load_mean']:.1f} / {load['load_max']:.1f}"),
        (
            "train reward first-5 -> last-5",
            f"{reward[0]:.3f} -> {reward[1]:.3f}" if reward else "-",
        ),
    ]
    for grade, label in (("strict", "strict"), ("lenient", "lenient"), ("formatted", "format")):
        before, after = base.grades[grade], final.grades[grade]
        rows.append(
            (
                f"held-out {label}",
                f"{pct(base.rate(grade))} -> {pct(final.rate(grade))} ({flips(before, after)})",
            )
        )
    for grade in ("strict", "lenient"):
        interval = bootstrap_mean(gains(base.grades[grade], final.grades[grade]))
        rows.append((f"{grade} gain, 95 % CI", str(interval)))
    return rows


def render_table(
    task: Task,
    results: dict[str, dict[str, Any]],
    base: Evaluated,
    header: list[str],
) -> tuple[str, dict[str, Interval]]:
    lines = [*header, ""]
    columns = {name: dict(system_rows(name, **results[name], base=base)) for name in results}
    names = list(columns)
    keys = list(next(iter(columns.values())))
    width = max(len(k) for k in keys) + 2
    lines.append(f"{'':<{width}}" + "".join(f"{n:<44}" for n in names))
    for key in keys:
        lines.append(f"{key:<{width}}" + "".join(f"{columns[n][key]:<44}" for n in names))
    differences: dict[str, Interval] = {}
    if set(names) == set(SYSTEMS):
        lines.append("")
        for grade in ("strict", "lenient", "formatted"):
            diff = gain_difference(
                base.grades[grade],
                results["ours"]["final"].grades[grade],
                results["trl"]["final"].grades[grade],
            )
            differences[grade] = bootstrap_mean(diff)
            lines.append(
                f"ours - TRL, {grade} gain: {differences[grade]} (bootstrap over problems)"
            )
    return "\n".join(lines), differences


def plot(curves: dict[str, list[Evaluated]], base: Evaluated, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for name, points in curves.items():
        for grade, style in (("strict", "-"), ("lenient", ":")):
            xs = [0.0] + [p.elapsed_s / 60 for p in points]
            ys = [100 * base.rate(grade)] + [100 * p.rate(grade) for p in points]
            axis.plot(xs, ys, style, marker="o", label=f"{name} {grade}")
    axis.set_xlabel("wall-clock minutes of training")
    axis.set_ylabel("held-out greedy accuracy (%)")
    axis.set_title("held-out accuracy vs wall-clock time (same task, budget, grader)")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def train_system(
    name: str,
    args: argparse.Namespace,
    task: Task,
    run_dir: Path,
    base_model: Path,
    marks: list[float],
) -> dict[str, Any] | None:
    """Train one system for the budget; -> its training figures, load and snapshots (None: it
    failed)."""
    with LoadSampler() as load:
        if name == "ours":
            ours = run_ours(
                run_dir / "ours", args.minutes, args.seed, marks, args.ours_arg, args.env_config
            )
            if ours.exit_code != 0:
                return None
            shots = ours.snapshots
            batch_size = parse_settings(args.ours_arg).batch_size
            training = ours_training(run_dir / "ours", task, batch_size)
        else:
            spec = TrlSpec(
                str(run_dir / "trl"),
                str(base_model),
                args.minutes,
                args.seed,
                marks,
                args.trl_threads,
                str(args.env_config),
                {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.trl_config)},
            )
            code, _ = run_trl(spec)
            if code != 0:
                return None
            shots = trl_snapshots(run_dir / "trl")
            training = trl_training(run_dir / "trl")
    return {
        "training": training,
        "load": load.summary(),
        "snapshots": [{**asdict(s), "folder": str(s.folder)} for s in shots],
    }


def machine_line() -> str:
    cpus = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return (
        f"{platform.node()}: {cpus} CPUs, {platform.platform()}, Python {platform.python_version()}"
    )


def curve_point(point: Evaluated) -> dict[str, Any]:
    return {
        "minutes": point.elapsed_s / 60,
        "step": point.step,
        "label": point.label,
        **{g: point.rate(g) for g in GRADES},
    }


def run_task(
    args: argparse.Namespace, name: str, env_config: Path, run_dir: Path, base_model: Path
) -> dict[str, Any] | None:
    """Both systems on one task, then the evaluation; -> the task's summary (None: a system
    failed). Writes ``table.txt``, ``summary.json`` and ``accuracy_vs_minutes.png`` in
    ``run_dir``."""
    (run_dir / "eval").mkdir(parents=True, exist_ok=True)
    task = Task.load(env_config, args.seed)
    check = task.disjointness
    print(f"[{name}] {task.description}; run folder {run_dir}", flush=True)
    print(
        f"[{name}] held-out: {check.eval_problems} problems, {check.overlap} in the training "
        f"pool of {check.training_pool:,} (both systems train on that pool)",
        flush=True,
    )
    budget = args.minutes * 60
    marks = [budget * k / args.points for k in range(1, args.points)]
    systems = [args.only] if args.only else list(SYSTEMS)
    records: dict[str, dict[str, Any]] = {}
    task_args = argparse.Namespace(**{**vars(args), "env_config": env_config})
    for system in systems:
        record_file = run_dir / f"{system}-training.json"
        if not args.eval_only:
            print(f"[{name}] training {system} for {args.minutes:g} min ...", flush=True)
            record = train_system(system, task_args, task, run_dir, base_model, marks)
            if record is None:
                print(f"[{name}] {system} failed: see {run_dir}/{system}.log")
                return None
            record_file.write_text(json.dumps(record, indent=2))
        elif not record_file.exists():
            print(f"--eval-only: {record_file} is missing (train {system} first)")
            return None
        records[system] = json.loads(record_file.read_text())
    snapshots = {
        system: [Snapshot(**{**s, "folder": Path(s["folder"])}) for s in record["snapshots"]]
        for system, record in records.items()
    }
    print(f"[{name}] evaluating the base model and every snapshot (greedy) ...", flush=True)
    eval_started = time.monotonic()
    out, batch, threads = run_dir / "eval", args.eval_batch, args.eval_threads
    base = evaluate(task, None, base_model, out, batch, threads)
    curves = {
        system: [evaluate(task, s, base_model, out, batch, threads) for s in shots]
        for system, shots in snapshots.items()
    }
    eval_s = time.monotonic() - eval_started
    trained = report.trained_questions(
        run_dir / "ours" / "rollouts.jsonl", {e["question"] for e in task.held_out}
    )
    header = [
        f"learning_vs_trl {datetime.now():%Y-%m-%d %H:%M}, task {name}, seed {args.seed}, "
        f"{args.minutes:g} min each; {machine_line()}",
        f'task: {task.description}, prompt "{task.prompt(task.held_out[0])[-1]["content"]}"',
        f"held-out: {check.eval_problems} problems; overlap with the training pool of "
        f"{check.training_pool:,}: {check.overlap}; among ours' trained prompts: {len(trained)}",
        f"evaluation: greedy, {task.max_tokens} new tokens, one evaluator for both; "
        f"{eval_s / 60:.1f} min, after training",
    ]
    results = {
        system: {"training": records[system]["training"], "final": curves[system][-1],
                 "load": records[system]["load"]}
        for system in systems
    }  # fmt: skip
    table, differences = render_table(task, results, base, header)
    print(table, flush=True)
    (run_dir / "table.txt").write_text(table + "\n")
    plot(curves, base, run_dir / "accuracy_vs_minutes.png")
    summary = {
        "task": name,
        "run_dir": str(run_dir),
        "description": task.description,
        "seed": args.seed,
        "minutes": args.minutes,
        "disjointness": {
            "eval_problems": check.eval_problems,
            "overlap": check.overlap,
            "training_pool": check.training_pool,
            "trained_prompt_overlap": len(trained),
        },
        "base": {g: base.rate(g) for g in GRADES},
        "systems": {
            system: {
                "training": records[system]["training"],
                "load": records[system]["load"],
                "curve": [curve_point(p) for p in curves[system]],
            }
            for system in systems
        },
        "difference_ours_minus_trl": {g: vars(i) for g, i in differences.items()},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    run_dir = (
        args.run_dir or Path("runs") / datetime.now().strftime("learning-vs-trl-%Y%m%d-%H%M%S")
    ).resolve()
    base_model = ensure_test_model()
    tasks = {"custom": args.env_config} if args.env_config else {
        name: TASKS[name] for name in args.tasks.split(",")
    }  # fmt: skip
    print(f"run folder: {run_dir}; tasks {', '.join(tasks)}; seed {args.seed}", flush=True)
    summaries = []
    for name, env_config in tasks.items():
        summary = run_task(args, name, env_config, run_dir / name, base_model)
        if summary is None:
            return 1
        summaries.append(summary)
    table = pooled_table(summaries, f"seed {args.seed}")
    print(table)
    (run_dir / "table.txt").write_text(table + "\n")
    print(f"wrote {run_dir} ({(time.monotonic() - started) / 60:.1f} min in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
