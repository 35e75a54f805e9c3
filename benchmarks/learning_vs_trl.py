"""Does our loop learn, and better than TRL? Held-out greedy accuracy, side by side, one command.

Runs, one after the other on this machine, (a) our full loop as ``scripts/demo`` runs it
(``atropos-local``: broker + embedded inference + reasoning-gym env + GRPO trainer) and (b)
TRL's ``GRPOTrainer``, each at its settings (``--settings-from``: the sweep's choice on the
validation set, ``learning_sweep.py``; else each one's defaults), and with a sweep's choice
(c) TRL at its documented defaults too, on the same model (the offline SmolLM2-135M-Instruct),
task, prompt, reward function, loss family (Dr GRPO), wall-clock budget and seed. The seed
gives its own training stream, validation and test problems (``StreamSeeds``). Each system's
weights are kept every ~5 minutes and evaluated afterwards (off the budget) by one evaluator,
atropos-local's own (``env.py evaluate`` on the embedded server's fast path): greedy replies to
the seed's test problems, none of which either system can train on (checked at start),
graded strict (exact ``<answer>N</answer>`` and right), lenient (right at all) and for format.
During ours' run, atropos-local's held-out drop warning watches the validation set
(``--drop-check-every-steps``); TRL has none, and the table flags a final snapshot of either
system more than 5 points below its best.

One invocation is one cell of the grid (one task, one seed; 20 min a system, ~80 min in all
with evaluation and TRL at its defaults):

    .venv/bin/python benchmarks/learning_vs_trl.py --tasks three_sums --seed 1 \
        --settings-from docs/learning-vs-trl/sweep/sweep.jsonl
    .venv/bin/python benchmarks/learning_vs_trl.py --run-dir DIR --eval-only   # (re)evaluate
    .venv/bin/python benchmarks/learning_pool.py      # pools the committed grid, names gaps

Writes ``runs/learning-vs-trl/seed<N>/<task>/``: ``table.txt`` (what it prints),
``summary.json``, ``accuracy_vs_minutes.png``, per-problem ``eval/*.jsonl``, each system's
``*-training.json`` (figures, load, snapshots) and logs. Run again, the same command resumes a
cut-off run (a system that finished training is not trained again; graded models are read
back). A finished cell is copied to ``docs/learning-vs-trl/grid/<task>-seed<N>/`` (``--publish``).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
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
from benchmarks.learning_settings import DEFAULTS, Setting, settings_for
from benchmarks.learning_systems import (
    GRID_SEEDS,
    SWEEP_SEED,
    TASKS,
    LoadSampler,
    Snapshot,
    Task,
    TrlSpec,
    run_ours,
    run_trl,
    served_greedy_answers,
    trl_snapshots,
    with_tokenizer,
)
from benchmarks.machine import cpu_facts

SYSTEMS = ("ours", "trl")
TRL_DEFAULTS = "trl_defaults"
"""TRL at its documented defaults, beside TRL at the sweep's choice (the table's second row)."""
GRADES = ("strict", "lenient", "formatted")
DROP = 0.05
"""A final snapshot this far (absolute) below the run's best is flagged (atropos-local's
--eval-drop-warning default)."""
PUBLISHED = Path(__file__).resolve().parents[1] / "docs" / "learning-vs-trl" / "tuned-grid"
RESUMED_SETTINGS = ("minutes", "points", "seed", "ours_arg", "trl_config", "chosen",
                    "drop_check_every_steps")  # fmt: skip
"""What a resumed run folder must have been started with: a run's snapshots are only
comparable with those of the same budget, marks and seed."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="Budget of each system.")
    parser.add_argument(
        "--seed",
        type=int,
        default=GRID_SEEDS[0],
        help=f"Run seed: both systems' seed and the data's (its own training stream, validation "
        f"and test sets); the grid runs seeds {', '.join(map(str, GRID_SEEDS))}, the sweep "
        f"{SWEEP_SEED}.",
    )
    parser.add_argument(
        "--points", type=int, default=4, help="Evaluated moments per system (4: every 5 min)."
    )
    parser.add_argument(
        "--settings-from",
        type=Path,
        default=None,
        help="The sweep's JSON lines (learning_sweep.py): each system runs at its chosen "
        "setting for the task, and TRL at its defaults too. Default: both at their defaults.",
    )
    parser.add_argument(
        "--drop-check-every-steps",
        type=int,
        default=15,
        help="Ours: atropos-local's held-out drop warning, evaluating the validation set every "
        "N steps during the run (~5 min on sums; it shares the CPU with the rollouts); 0: off.",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="Output folder (default runs/learning-vs-trl/seed<N>: running the same command "
        "again resumes it).",
    )
    parser.add_argument(
        "--tasks",
        default="sums",
        help=f"Tasks to run, one after the other (of {', '.join(TASKS)}); the grid runs one "
        "task per invocation.",
    )
    parser.add_argument(
        "--env-config", type=Path, default=None, help="Instead of --tasks: one task (env YAML)."
    )
    parser.add_argument(
        "--only", choices=(*SYSTEMS, TRL_DEFAULTS), default=None, help="Run one system only."
    )
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
    parser.add_argument(
        "--eval-threads", type=int, default=2, help="Torch threads of the evaluating server."
    )
    parser.add_argument(
        "--publish",
        type=Path,
        default=PUBLISHED,
        help="Where each finished task's table, plot, summary and per-problem grades are "
        "copied, as <task>-seed<N>/ (the folder benchmarks/learning_pool.py pools).",
    )
    parser.add_argument("--no-publish", dest="publish", action="store_const", const=None)
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
    grades: dict[str, list[bool]]  # grade -> one bool per problem of the split, in task order

    def rate(self, grade: str) -> float:
        values = self.grades[grade]
        return sum(values) / len(values)


def evaluate(
    task: Task,
    snapshot: Snapshot | None,
    base: Path,
    out: Path,
    threads: int,
    split: str = "test",
) -> Evaluated:
    """Greedy replies of ``snapshot`` (None: the base model) to every problem of ``split``, on
    the fast path atropos-local evaluates with; a model already graded in ``out`` is read
    back."""
    label = f"{snapshot.system}-step-{snapshot.step}" if snapshot else "base"
    elapsed, step = (snapshot.elapsed_s, snapshot.step) if snapshot else (0.0, 0)
    path = out / f"{label}.jsonl"
    if path.exists():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        if [r["problem"] for r in rows] == [task.key(e) for e in task.problems(split)]:
            return Evaluated(label, elapsed, step, {g: [r[g] for r in rows] for g in GRADES})
    model = with_tokenizer(snapshot.folder, base) if snapshot else base
    started = time.monotonic()
    answers = served_greedy_answers(model, task, out / "served" / label, threads, split=split)
    seconds = time.monotonic() - started
    print(f"  {label}: strict {pct(sum(a['strict'] for a in answers) / len(answers))} "
          f"({seconds:.0f} s with the server's start)", flush=True)  # fmt: skip
    keep = ("problem", "question", "answer", "response", *GRADES)
    with path.open("w") as handle:
        for answer in answers:
            handle.write(json.dumps({k: answer[k] for k in keep}) + "\n")
    return Evaluated(label, elapsed, step, {g: [bool(a[g]) for a in answers] for g in GRADES})


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
        "drop_check": ours_drop_check(run_dir),
    }


def ours_drop_check(run_dir: Path) -> dict[str, Any]:
    """What atropos-local's held-out drop warning saw during ours' run (validation set):
    strict accuracy per evaluated step, and the warnings it raised."""
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    return {
        "validation_strict": {str(s["step"]): s["strict"]
                              for s in summary.get("held_out_snapshots") or []},
        "warnings": [w for w in summary.get("warnings_raised") or []
                     if "held-out" in w.get("warning", "")],
    }  # fmt: skip


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


def drop_flag(curve: list[Evaluated]) -> str:
    """The final snapshot against the run's best (strict); flagged beyond ``DROP``."""
    best = max(curve, key=lambda p: p.rate("strict"))
    fall = best.rate("strict") - curve[-1].rate("strict")
    flag = f"DROP WARNING, {100 * fall:.1f} points" if fall > DROP else "no drop"
    return f"{pct(best.rate('strict'))} at {best.elapsed_s / 60:.1f} min; {flag}"


def system_rows(
    name: str,
    setting: str,
    training: dict[str, Any],
    base: Evaluated,
    curve: list[Evaluated],
    load: dict[str, float],
) -> list[tuple[str, str]]:
    reward = first_last(training["reward_per_step"])
    final = curve[-1]
    rows = [
        ("setting", setting),
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
    rows.append(("best snapshot (strict)", drop_flag(curve)))
    return rows


def render_table(
    task: Task,
    results: dict[str, dict[str, Any]],
    base: Evaluated,
    header: list[str],
) -> tuple[str, dict[str, dict[str, Interval]]]:
    lines = [*header, ""]
    columns = {name: dict(system_rows(name, **results[name], base=base)) for name in results}
    names = list(columns)
    keys = list(next(iter(columns.values())))
    width = max(len(k) for k in keys) + 2
    lines.append(f"{'':<{width}}" + "".join(f"{n:<44}" for n in names))
    for key in keys:
        lines.append(f"{key:<{width}}" + "".join(f"{columns[n][key]:<44}" for n in names))
    differences: dict[str, dict[str, Interval]] = {}
    for other in (n for n in names if n != "ours" and "ours" in names):
        lines.append("")
        differences[other] = {}
        for grade in GRADES:
            diff = gain_difference(
                base.grades[grade],
                results["ours"]["curve"][-1].grades[grade],
                results[other]["curve"][-1].grades[grade],
            )
            differences[other][grade] = bootstrap_mean(diff)
            lines.append(f"ours - {other}, {grade} gain: {differences[other][grade]} "
                         "(bootstrap over problems)")  # fmt: skip
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
    system: str,
    setting: Setting,
    args: argparse.Namespace,
    task: Task,
    run_dir: Path,
    base_model: Path,
    marks: list[float],
) -> dict[str, Any] | None:
    """Train one system at ``setting`` for the budget; -> its training figures, load and
    snapshots (None: it failed). Ours' drop warning watches the validation set."""
    folder = run_dir / system
    with LoadSampler() as load:
        if setting.system == "ours":
            every = args.drop_check_every_steps
            ours = run_ours(
                folder, args.minutes, args.seed, marks, [*setting.ours_args(), *args.ours_arg],
                args.env_config, env_args=[*task.env_flags("validation"), *setting.env_flags()],
                eval_every_steps=every, eval_size=len(task.validation) if every else 0,
            )  # fmt: skip
            if ours.exit_code != 0:
                return None
            shots = ours.snapshots
            batch_size = parse_settings(args.ours_arg).batch_size
            training = ours_training(folder, task, batch_size)
        else:
            overrides = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.trl_config)}
            spec = TrlSpec(str(folder), str(base_model), args.minutes, args.seed, marks,
                           args.trl_threads, str(args.env_config),
                           {**setting.trl_overrides(), **overrides})  # fmt: skip
            code, _ = run_trl(spec)
            if code != 0:
                return None
            shots = trl_snapshots(folder, system)
            training = trl_training(folder)
    return {
        "setting": setting.key,
        "training": training,
        "load": load.summary(),
        "snapshots": [{**asdict(s), "folder": str(s.folder)} for s in shots],
    }


def machine_line(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """Names the CPU and its vector extensions: a cell's step counts compare only between
    machines that share them."""
    cpus = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    cpu = cpu_facts(cpuinfo)
    return (
        f"{platform.node()}: {cpus} CPUs, {cpu['model']} (has {', '.join(cpu['flags']) or 'none'}"
        f"; lacks {', '.join(cpu['lacks']) or 'nothing'}), {platform.platform()}, "
        f"Python {platform.python_version()}"
    )


def curve_point(point: Evaluated) -> dict[str, Any]:
    return {
        "minutes": point.elapsed_s / 60,
        "step": point.step,
        "label": point.label,
        **{g: point.rate(g) for g in GRADES},
    }


def cell_systems(args: argparse.Namespace, task_name: str) -> dict[str, Setting]:
    """A cell's systems and their settings: ours and TRL at the sweep's choice for the task
    (else their defaults), and TRL at its defaults too when that choice is another setting."""
    chosen = settings_for(args.settings_from, task_name)
    systems = dict(chosen)
    if not chosen["trl"].is_default:
        systems[TRL_DEFAULTS] = DEFAULTS["trl"]
    if args.only:
        return {args.only: systems.get(args.only, DEFAULTS["trl"])}
    return systems


def train_all(
    args: argparse.Namespace,
    name: str,
    task: Task,
    systems: dict[str, Setting],
    run_dir: Path,
    base_model: Path,
) -> dict[str, dict[str, Any]] | None:
    """Each system's training record: trained now, or read back from an earlier invocation
    (None: a system failed, or --eval-only lacks one)."""
    budget = args.minutes * 60
    marks = [budget * k / args.points for k in range(1, args.points)]
    records: dict[str, dict[str, Any]] = {}
    for system, setting in systems.items():
        record_file = run_dir / f"{system}-training.json"
        if record_file.exists():
            print(f"[{name}] {system}: trained before ({record_file.name}), not again", flush=True)
        elif args.eval_only:
            print(f"--eval-only: {record_file} is missing (train {system} first)")
            return None
        else:
            if (run_dir / system).exists():  # cut off mid-training: start that system over
                print(f"[{name}] {system}: its run was cut off; training it again", flush=True)
                shutil.rmtree(run_dir / system)
            print(f"[{name}] training {system} ({setting.key}) for {args.minutes:g} min ...",
                  flush=True)  # fmt: skip
            record = train_system(system, setting, args, task, run_dir, base_model, marks)
            if record is None:
                print(f"[{name}] {system} failed: see {run_dir}/{system}.log")
                return None
            record_file.write_text(json.dumps(record, indent=2))
        records[system] = json.loads(record_file.read_text())
    return records


def run_task(
    args: argparse.Namespace, name: str, env_config: Path, run_dir: Path, base_model: Path
) -> dict[str, Any] | None:
    """Every system on one task, then the evaluation on the seed's test set; -> the task's
    summary (None: a system failed). Writes ``table.txt``, ``summary.json`` and
    ``accuracy_vs_minutes.png`` in ``run_dir``."""
    (run_dir / "eval").mkdir(parents=True, exist_ok=True)
    systems = cell_systems(args, name)
    chosen = {system: setting.key for system, setting in systems.items()}
    task_args = argparse.Namespace(**{**vars(args), "env_config": env_config, "chosen": chosen})
    if not args.eval_only and (refused := claim_run_dir(run_dir, task_args)) is not None:
        print(refused)
        return None
    task = Task.load(env_config, args.seed)
    check = task.disjointness
    print(f"[{name}] {task.description}; run folder {run_dir}", flush=True)
    print(f"[{name}] test: {check.eval_problems} problems, {check.overlap} in the training pool "
          f"of {check.training_pool:,} (both systems train on that pool); validation: "
          f"{len(task.validation)}, disjoint from both", flush=True)  # fmt: skip
    records = train_all(task_args, name, task, systems, run_dir, base_model)
    if records is None:
        return None
    print(f"[{name}] evaluating the base model and every snapshot (greedy) ...", flush=True)
    eval_started = time.monotonic()
    out, threads = run_dir / "eval", args.eval_threads
    base = evaluate(task, None, base_model, out, threads)
    curves = {
        system: [evaluate(task, Snapshot(**{**s, "folder": Path(s["folder"])}), base_model, out,
                          threads) for s in record["snapshots"]]
        for system, record in records.items()
    }  # fmt: skip
    eval_s = time.monotonic() - eval_started
    trained = report.trained_questions(
        run_dir / "ours" / "rollouts.jsonl", {e["question"] for e in task.test}
    )
    shared = task.shared_test_problems(sorted({SWEEP_SEED, *GRID_SEEDS, args.seed}))
    header = [
        f"learning_vs_trl {datetime.now():%Y-%m-%d %H:%M}, task {name}, seed {args.seed}, "
        f"{args.minutes:g} min each; {machine_line()}",
        f'task: {task.description}, prompt "{task.prompt(task.test[0])[-1]["content"]}"',
        f"test: {check.eval_problems} problems; overlap with the training pool of "
        f"{check.training_pool:,}: {check.overlap}; among ours' trained prompts: {len(trained)}; "
        f"shared with other seeds' test sets (chance): "
        f"{', '.join(f'seed {k} {v}' for k, v in shared.items())}",
        f"evaluation: greedy, {task.max_tokens} new tokens, one evaluator for all (atropos-"
        f"local's: env.py evaluate on the embedded server); {eval_s / 60:.1f} min, after training",
    ]
    results = {
        system: {"setting": records[system]["setting"], "training": records[system]["training"],
                 "curve": curves[system], "load": records[system]["load"]}
        for system in records
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
        "seeds": asdict(task.seeds),
        "minutes": args.minutes,
        "disjointness": {
            "eval_problems": check.eval_problems,
            "overlap": check.overlap,
            "training_pool": check.training_pool,
            "trained_prompt_overlap": len(trained),
            "validation_problems": len(task.validation),
            "test_shared_with_seeds": shared,
        },
        "base": {g: base.rate(g) for g in GRADES},
        "systems": {
            system: {
                "setting": records[system]["setting"],
                "training": records[system]["training"],
                "load": records[system]["load"],
                "curve": [curve_point(p) for p in curves[system]],
            }
            for system in records
        },
        "differences": {o: {g: vars(i) for g, i in d.items()} for o, d in differences.items()},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if args.publish is not None and set(SYSTEMS) <= set(records):
        labels = ["base", *(p.label for points in curves.values() for p in points)]
        print(f"[{name}] published to {publish(run_dir, summary, labels, args.publish)}")
    return summary


def claim_run_dir(run_dir: Path, args: argparse.Namespace) -> str | None:
    """Records the settings a run folder is started with; None if it is new or was started
    with the same ones (then it resumes), else why it cannot be resumed with these."""
    path = run_dir / "invocation.json"
    settings = {key: getattr(args, key, None) for key in RESUMED_SETTINGS}
    if not path.exists():
        path.write_text(json.dumps(settings, indent=2))
        return None
    before = json.loads(path.read_text())
    changed = [f"{k} {before.get(k)!r} -> {settings[k]!r}" for k in settings
               if before.get(k) != settings[k]]  # fmt: skip
    if changed:
        return (f"{run_dir} was started with other settings ({'; '.join(changed)}): run it "
                "with the same ones to resume it, or pass another --run-dir")  # fmt: skip
    return None


def publish(run_dir: Path, summary: dict[str, Any], labels: list[str], target: Path) -> Path:
    """What a finished task leaves for the record (table, plot, summary, training records,
    each evaluated model's per-problem grades), in ``target/<task>-seed<N>/``."""
    folder = target / f"{summary['task']}-seed{summary['seed']}"
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "eval").mkdir(parents=True)
    for name in ("table.txt", "accuracy_vs_minutes.png", "invocation.json",
                 *(f"{s}-training.json" for s in summary["systems"])):  # fmt: skip
        shutil.copy2(run_dir / name, folder / name)
    for label in labels:
        shutil.copy2(run_dir / "eval" / f"{label}.jsonl", folder / "eval" / f"{label}.jsonl")
    (folder / "summary.json").write_text(json.dumps({**summary, "run_dir": "."}, indent=2))
    return folder


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    run_dir = (args.run_dir or Path("runs") / "learning-vs-trl" / f"seed{args.seed}").resolve()
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
