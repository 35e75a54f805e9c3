"""Tables and plots over several ``learning_vs_trl.py`` runs: per task and seed, and pooled.

Each run folder holds one subfolder per task with its ``summary.json`` and per-problem grades
(``eval/<label>.jsonl``). Per task and seed: each system's held-out strict accuracy before and
after, its gain with a 95 % bootstrap interval over problems, ours - TRL (the per-problem
difference of the two gains), and the minutes ours took to reach TRL's final strict accuracy
(the first snapshot at or above it). Pooled over seeds: the same differences over every
(seed, problem) pair, resampled within each seed. ``--docs`` writes the table between the
grid-table markers of README.md and docs/results.md.

    python benchmarks/learning_pool.py           # the committed grid, and what it still lacks
    python benchmarks/learning_pool.py --out docs/learning-vs-trl/grid/pooled --docs
    python benchmarks/learning_pool.py runs/learning-vs-trl/seed0 runs/learning-vs-trl/seed1 \\
        --out docs/learning-vs-trl/pooled
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.localrun.bootstrap import Interval, bootstrap_mean, gain_difference, gains

SYSTEMS = ("ours", "trl")
REPO = Path(__file__).resolve().parents[1]
GRID = REPO / "docs" / "learning-vs-trl" / "grid"
GRID_TASKS = ("sums", "three_sums")  # benchmarks.learning_systems.TASKS


def grades_of(run_dir: Path, label: str, grade: str = "strict") -> list[bool]:
    """One bool per held-out problem, in task order, from ``eval/<label>.jsonl``."""
    rows = (run_dir / "eval" / f"{label}.jsonl").read_text().splitlines()
    return [bool(json.loads(row)[grade]) for row in rows]


def minutes_to_reach(curve: list[dict[str, Any]], target: float) -> float | None:
    """Minutes of the first snapshot whose strict accuracy is at least ``target``."""
    for point in curve:
        if point["strict"] >= target:
            return float(point["minutes"])
    return None


def stratified_bootstrap(groups: list[list[float]], resamples: int = 10_000) -> Interval:
    """Mean over every value of ``groups`` with a 95 % interval, each group (a seed)
    resampled within itself so every resample keeps each seed's share."""
    rng = np.random.default_rng(0)
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]  # each (N_seed,)
    total = sum(len(a) for a in arrays)
    means = np.zeros(resamples)
    for values in arrays:
        picks = rng.integers(0, len(values), size=(resamples, len(values)))
        means += values[picks].sum(axis=1)
    means /= total
    low, high = np.quantile(means, [0.025, 0.975])
    estimate = float(np.concatenate(arrays).mean())
    return Interval(estimate, float(low), float(high), 0.95)


def seed_row(summary: dict[str, Any]) -> dict[str, Any]:
    """The figures of one task and seed (both systems must have run)."""
    run_dir = Path(summary["run_dir"])
    base = grades_of(run_dir, "base")
    finals = {s: summary["systems"][s]["curve"][-1] for s in SYSTEMS}
    after = {s: grades_of(run_dir, finals[s]["label"]) for s in SYSTEMS}
    trl_final = finals["trl"]["strict"]
    return {
        "task": summary["task"],
        "seed": summary["seed"],
        "before": summary["base"]["strict"],
        "after": {s: finals[s]["strict"] for s in SYSTEMS},
        "gain": {s: bootstrap_mean(gains(base, after[s])) for s in SYSTEMS},
        "steps": {s: summary["systems"][s]["training"]["steps"] for s in SYSTEMS},
        "difference": gain_difference(base, after["ours"], after["trl"]),
        "minutes_to_trl": minutes_to_reach(summary["systems"]["ours"]["curve"], trl_final),
        "trl_minutes": float(finals["trl"]["minutes"]),
        "ours_best": max(p["strict"] for p in summary["systems"]["ours"]["curve"]),
        "minutes": summary["minutes"],
    }


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _points(interval: Interval) -> str:
    return f"{100 * interval.estimate:+.1f} [{100 * interval.low:+.1f}, {100 * interval.high:+.1f}]"


def pooled_table(summaries: list[dict[str, Any]], title: str) -> str:
    """Per task and seed, then pooled per task (when a task has several seeds)."""
    rows = [seed_row(s) for s in summaries if set(SYSTEMS) <= set(s["systems"])]
    if not rows:
        return f"{title}: no task with both systems"
    lines = [
        f"learning_vs_trl, {title}: held-out strict accuracy (greedy), 95 % bootstrap intervals",
        "",
        "| task | seed | steps ours / TRL | before | ours after (gain) | TRL after (gain) "
        "| ours - TRL | ours reaches TRL's final at |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_task[row["task"]].append(row)
        reach = row["minutes_to_trl"]
        reached = f"{reach:.1f} min of {row['trl_minutes']:.1f}" if reach is not None else "not"
        lines.append(
            f"| {row['task']} | {row['seed']} | {row['steps']['ours']} / {row['steps']['trl']} "
            f"| {_pct(row['before'])} | {_pct(row['after']['ours'])} "
            f"({_points(row['gain']['ours'])}) | {_pct(row['after']['trl'])} "
            f"({_points(row['gain']['trl'])}) | {_points(bootstrap_mean(row['difference']))} "
            f"| {reached} |"
        )
    for task, task_rows in by_task.items():
        lines.append("")
        if len(task_rows) < 2:
            lines.append(f"{task}, seed {task_rows[0]['seed']} only: nothing to pool yet")
        else:
            pooled = stratified_bootstrap([r["difference"] for r in task_rows])
            worst = min(bootstrap_mean(r["difference"]).estimate for r in task_rows)
            lines.append(
                f"{task}, pooled over seeds {sorted(r['seed'] for r in task_rows)}: ours - TRL "
                f"strict gain {_points(pooled)} points (resampled within each seed); lowest "
                f"seed {100 * worst:+.1f}"
            )
        lines += [f"  {line}" for line in target_lines(task_rows)]
    return "\n".join(lines)


def target_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 35's targets for one task's seeds, each met or missed with its figures."""

    def verdict(met: bool) -> str:
        return "met" if met else "MISSED"

    falls = {r["seed"]: r["ours_best"] - r["after"]["ours"] for r in rows}
    per_seed = {r["seed"]: bootstrap_mean(r["difference"]).estimate for r in rows}
    reach = {r["seed"]: r["minutes_to_trl"] for r in rows}
    halves = {r["seed"]: r["trl_minutes"] / 2 for r in rows}
    in_half = all(reach[s] is not None and reach[s] <= halves[s] for s in reach)
    reached = [
        f"seed {s} {'not reached' if m is None else f'{m:.1f} min'} (half: {halves[s]:.1f})"
        for s, m in reach.items()
    ]
    out = [
        f"ours ends within 5 points of its best snapshot: {verdict(max(falls.values()) <= 0.05)} "
        f"(falls {', '.join(f'seed {s} {100 * v:.1f}' for s, v in falls.items())})",
        f"ours - TRL >= +5 on every seed: {verdict(min(per_seed.values()) >= 0.05)} "
        f"({', '.join(f'seed {s} {100 * v:+.1f}' for s, v in per_seed.items())})",
        f"ours reaches TRL's final in half TRL's time: {verdict(in_half)} ({', '.join(reached)})",
    ]
    if len(rows) >= 2:
        pooled = stratified_bootstrap([r["difference"] for r in rows])
        met = pooled.estimate >= 0.10 and pooled.low > 0
        out.insert(1, f"pooled ours - TRL >= +10, interval above 0: {verdict(met)} "
                      f"({_points(pooled)})")  # fmt: skip
    return out


GRID_SEEDS = (0, 1, 2)


def missing_cells(summaries: list[dict[str, Any]], tasks: list[str]) -> list[str]:
    """The grid's task x seed cells with no finished run of both systems."""
    done = {(s["task"], s["seed"]) for s in summaries if set(SYSTEMS) <= set(s["systems"])}
    return [f"{t}-seed{seed}" for t in tasks for seed in GRID_SEEDS if (t, seed) not in done]


def plot_curves(summaries: list[dict[str, Any]], path: Path) -> None:
    """Held-out strict accuracy against minutes, one panel per task, every seed and system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({s["task"] for s in summaries})
    figure, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    colors = {"ours": "tab:blue", "trl": "tab:orange"}
    for axis, task in zip(axes[0], tasks, strict=True):
        for summary in (s for s in summaries if s["task"] == task):
            for system, record in summary["systems"].items():
                xs = [0.0] + [p["minutes"] for p in record["curve"]]
                ys = [100 * summary["base"]["strict"]] + [
                    100 * p["strict"] for p in record["curve"]
                ]
                axis.plot(xs, ys, marker="o", color=colors.get(system),
                          alpha=0.8, label=f"{system} seed {summary['seed']}")  # fmt: skip
        axis.set_title(f"{task}: held-out strict accuracy")
        axis.set_xlabel("wall-clock minutes of training")
        axis.set_ylabel("%")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def load_summaries(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """Every ``<task folder>/summary.json`` under ``run_dirs``, its grades read from beside it
    (so a folder copied elsewhere, as the published grid, still pools)."""
    found = []
    for run_dir in run_dirs:
        for path in sorted(run_dir.glob("*/summary.json")):
            found.append({**json.loads(path.read_text()), "run_dir": str(path.parent)})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs",
        type=Path,
        nargs="*",
        default=[GRID],
        help="learning_vs_trl.py run folders (default: the committed grid, docs/learning-vs-trl/"
        "grid)",
    )
    parser.add_argument("--out", type=Path, default=None, help="Write <out>.txt and <out>.png")
    parser.add_argument(
        "--docs",
        action="store_true",
        help="Also write the table between the grid-table markers of README.md and "
        "docs/results.md.",
    )
    args = parser.parse_args(argv)
    summaries = load_summaries(args.runs)
    if not summaries:
        print(f"no <task>/summary.json under {', '.join(map(str, args.runs))}")
        return 1
    seeds = sorted({s["seed"] for s in summaries})
    budgets = sorted({float(s["minutes"]) for s in summaries})
    table = pooled_table(summaries, f"seeds {seeds}, {' / '.join(f'{b:g}' for b in budgets)} "
                                    "min per system")  # fmt: skip
    if len(budgets) > 1:
        table += f"\n\nnot one budget: runs of {budgets} minutes are pooled together"
    missing = missing_cells(summaries, list(GRID_TASKS))
    table += "\n\n" + (f"missing from the grid: {', '.join(missing)}" if missing
                        else "the grid is complete")  # fmt: skip
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".txt").write_text(table + "\n")
        plot_curves(summaries, args.out.with_suffix(".png"))
        print(f"wrote {args.out.with_suffix('.txt')} and {args.out.with_suffix('.png')}")
    if args.docs:
        for page, text in ((RESULTS_PAGE, results_block(table)), (README, readme_block(table))):
            fill_block(page, text)
            print(f"filled the grid table of {page}")
    return 0


BLOCK = re.compile(
    r"(<!-- grid table: benchmarks/learning_pool.py -->\n).*?(\n<!-- end of grid table -->)", re.S
)
README = REPO / "README.md"
RESULTS_PAGE = REPO / "docs" / "results.md"


def results_block(table: str) -> str:
    """docs/results.md's grid: the per-cell table, then each task's lines as a list."""
    lines = table.splitlines()
    rows = [line for line in lines if line.startswith("|")]
    notes = [line for line in lines[1:] if line.strip() and not line.startswith("|")]
    listed = [f"  - {n.strip()}" if n.startswith("  ") else f"- {n}" for n in notes]
    return "\n".join(rows) + "\n\n" + "\n".join(listed)


def readme_block(table: str) -> str:
    """The README's grid: before and after per cell, ours - TRL, the pooled lines."""
    cells = [line for line in table.splitlines() if line.startswith("|")][2:]
    out = ["| task | seed | before | ours after | TRL after | ours - TRL, strict points |",
           "|---|---|---|---|---|---|"]  # fmt: skip
    for row in cells:
        task, seed, _, before, ours, trl, difference, _ = (
            c.strip() for c in row.strip("|").split("|")
        )
        out.append(f"| {task} | {seed} | {before} | {ours.split(' (')[0]} | {trl.split(' (')[0]} "
                   f"| {difference} |")  # fmt: skip
    pooled = [
        line
        for line in table.splitlines()
        if ", pooled over seeds" in line or line.startswith(("missing from", "the grid is"))
    ]
    return "\n".join(out) + ("\n\n" + "\n".join(f"- {p}" for p in pooled) if pooled else "")


def fill_block(page: Path, text: str) -> None:
    """Replaces what lies between the page's grid-table markers with ``text``."""
    source = page.read_text()
    if not BLOCK.search(source):
        raise SystemExit(f"{page}: no grid-table markers (<!-- grid table: ... -->) to fill")
    page.write_text(BLOCK.sub(lambda m: m.group(1) + text + m.group(2), source))


if __name__ == "__main__":
    raise SystemExit(main())
