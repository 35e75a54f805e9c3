"""Tables and plots over several ``learning_vs_trl.py`` runs: per task and seed, and pooled.

Each run folder holds one subfolder per task with its ``summary.json`` and per-problem grades
(``eval/<label>.jsonl``). Per task and seed: each system's held-out strict accuracy before and
after, its gain with a 95 % bootstrap interval over problems, ours - TRL (the per-problem
difference of the two gains), and the minutes ours took to reach TRL's final strict accuracy
(the first snapshot at or above it). Pooled over seeds, three intervals of the mean difference:
the hierarchical bootstrap (seeds resampled, then problems within each resampled seed: the
headline, since seeds differ more than their problems' noise says), a t-interval over the
per-seed differences, and the old one resampling problems within each seed only (too narrow
when seeds disagree). Where a cell also ran TRL at its defaults beside TRL at the sweep's
choice, a second pooled line compares ours with it. ``--docs`` writes the table between the
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
from benchmarks.learning_settings import DEFAULTS
from benchmarks.learning_systems import GRID_SEEDS, TASKS

SYSTEMS = ("ours", "trl")
REPO = Path(__file__).resolve().parents[1]
GRID = REPO / "docs" / "learning-vs-trl" / "grid"
OLD_GRID = (("sums", "three_sums"), (0, 1, 2))
"""Issue 35's grid (seeds as data seeds; TRL at its defaults), committed under GRID."""
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip
"""Student's t, 97.5 % quantile, for 1-30 degrees of freedom (beyond: 1.96)."""


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


def hierarchical_bootstrap(
    groups: list[list[float]], resamples: int = 10_000, seed: int = 0
) -> Interval:
    """Mean of the groups' (seeds') means with a 95 % interval: each resample draws as many
    seeds as there are, with replacement, then each drawn seed's values with replacement, so
    the interval holds the seed-to-seed spread as well as each seed's problem noise."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]  # each (N_seed,)
    count = len(arrays)
    picked = rng.integers(0, count, size=(resamples, count))  # (R, K): seeds drawn
    means = np.zeros(resamples)
    for position in range(count):
        for index, values in enumerate(arrays):
            rows = np.flatnonzero(picked[:, position] == index)
            draws = rng.integers(0, len(values), size=(len(rows), len(values)))
            means[rows] += values[draws].mean(axis=1)
    means /= count
    low, high = np.quantile(means, [0.025, 0.975])
    estimate = float(np.mean([a.mean() for a in arrays]))
    return Interval(estimate, float(low), float(high), 0.95)


def t_interval(values: list[float]) -> Interval:
    """Mean of per-seed values with a 95 % Student t interval (at least two seeds)."""
    if len(values) < 2:
        raise ValueError("a t-interval over seeds needs at least two seeds")
    array = np.asarray(values, dtype=np.float64)
    mean, spread = float(array.mean()), float(array.std(ddof=1))
    quantile = T_975[len(array) - 2] if len(array) - 1 <= len(T_975) else 1.96
    half = quantile * spread / np.sqrt(len(array))
    return Interval(mean, mean - half, mean + half, 0.95)


def seed_row(summary: dict[str, Any]) -> dict[str, Any]:
    """The figures of one task and seed (both systems must have run)."""
    run_dir = Path(summary["run_dir"])
    base = grades_of(run_dir, "base")
    finals = {s: summary["systems"][s]["curve"][-1] for s in SYSTEMS}
    after = {s: grades_of(run_dir, finals[s]["label"]) for s in SYSTEMS}
    trl_final = finals["trl"]["strict"]
    # TRL at its documented defaults beside TRL at the sweep's choice (issue 46's cells; in
    # issue 35's, "trl" itself ran at its defaults)
    defaults = summary["systems"].get("trl_defaults")
    separate_defaults = None
    if defaults is not None:
        defaults_after = grades_of(run_dir, defaults["curve"][-1]["label"])
        separate_defaults = {
            "after": defaults["curve"][-1]["strict"],
            "gain": bootstrap_mean(gains(base, defaults_after)),
            "steps": defaults["training"]["steps"],
            "difference": gain_difference(base, after["ours"], defaults_after),
        }
    return {
        "task": summary["task"],
        "seed": summary["seed"],
        "before": summary["base"]["strict"],
        "after": {s: finals[s]["strict"] for s in SYSTEMS},
        "gain": {s: bootstrap_mean(gains(base, after[s])) for s in SYSTEMS},
        "steps": {s: summary["systems"][s]["training"]["steps"] for s in SYSTEMS},
        "difference": gain_difference(base, after["ours"], after["trl"]),
        "defaults": separate_defaults,
        "settings": {s: summary["systems"][s].get("setting", DEFAULTS[s].key) for s in SYSTEMS},
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
    independent = all("seeds" in s for s in summaries)  # issue 46's grid, else issue 35's
    differences: dict[str, Interval] = {}  # per task, for issue 46's targets
    with_defaults = all(row["defaults"] is not None for row in rows)
    columns = TABLE_COLUMNS_WITH_DEFAULTS if with_defaults else TABLE_COLUMNS
    lines = [
        f"learning_vs_trl, {title}: held-out strict accuracy (greedy), 95 % bootstrap intervals",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_task[row["task"]].append(row)
        lines.append("| " + " | ".join(table_cells(row, with_defaults)) + " |")
    for task, task_rows in by_task.items():
        lines.append("")
        if len(task_rows) < 2:
            lines.append(f"{task}, seed {task_rows[0]['seed']} only: nothing to pool yet")
        else:
            seeds = [r["seed"] for r in task_rows]
            lines.append(pooled_line(task, seeds, [r["difference"] for r in task_rows], "TRL"))
            if all(r["defaults"] is not None for r in task_rows):  # else TRL ran at defaults
                lines.append(pooled_line(task, seeds,
                                         [r["defaults"]["difference"] for r in task_rows],
                                         "TRL at its defaults"))  # fmt: skip
        if independent:
            differences[task] = task_difference(task_rows)
            lines += [f"  {line}" for line in target_lines(task_rows, differences[task])]
        else:
            lines += [f"  {line}" for line in issue35_target_lines(task_rows)]
    if independent:
        lines += ["", *grid_target_lines(by_task, differences)]
    return "\n".join(lines)


TABLE_COLUMNS = ("task", "seed", "steps ours / TRL", "before", "ours after (gain)",
                 "TRL after (gain)", "ours - TRL", "ours reaches TRL's final at")  # fmt: skip
TABLE_COLUMNS_WITH_DEFAULTS = ("task", "seed", "steps ours / TRL / TRL at defaults", "before",
                               "ours after (gain)", "TRL after (gain)",
                               "TRL at defaults after (gain)", "ours - TRL",
                               "ours - TRL at defaults", "ours reaches TRL's final at")  # fmt: skip


def table_cells(row: dict[str, Any], with_defaults: bool) -> list[str]:
    """One task and seed's cells, in the order of TABLE_COLUMNS(_WITH_DEFAULTS)."""
    reach = row["minutes_to_trl"]
    reached = f"{reach:.1f} min of {row['trl_minutes']:.1f}" if reach is not None else "not"
    steps = f"{row['steps']['ours']} / {row['steps']['trl']}"
    after = [f"{_pct(row['after'][s])} ({_points(row['gain'][s])})" for s in SYSTEMS]
    difference = [_points(bootstrap_mean(row["difference"]))]
    if with_defaults:
        defaults = row["defaults"]
        steps += f" / {defaults['steps']}"
        after.append(f"{_pct(defaults['after'])} ({_points(defaults['gain'])})")
        difference.append(_points(bootstrap_mean(defaults["difference"])))
    return [row["task"], str(row["seed"]), steps, _pct(row["before"]), *after, *difference,
            reached]  # fmt: skip


def pooled_line(task: str, seeds: list[int], per_seed: list[list[float]], against: str) -> str:
    """Ours - ``against`` over the task's ``seeds`` (``per_seed``: each seed's per-problem
    difference of the gains): the three intervals, the lowest seed."""
    hierarchical = hierarchical_bootstrap(per_seed)
    over_seeds = t_interval([float(np.mean(d)) for d in per_seed])
    within = stratified_bootstrap(per_seed)
    worst = min(bootstrap_mean(d).estimate for d in per_seed)
    return (
        f"{task}, pooled over seeds {sorted(seeds)}: ours - {against} "
        f"strict gain {_points(hierarchical)} points (seeds, then problems resampled); "
        f"t over seeds [{100 * over_seeds.low:+.1f}, {100 * over_seeds.high:+.1f}]; within "
        f"seeds only [{100 * within.low:+.1f}, {100 * within.high:+.1f}]; lowest seed "
        f"{100 * worst:+.1f}"
    )


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def task_difference(rows: list[dict[str, Any]]) -> Interval:
    """Ours - TRL on one task: over seeds then problems (two seeds and more), else over the
    one seed's problems."""
    if len(rows) >= 2:
        return hierarchical_bootstrap([r["difference"] for r in rows])
    return bootstrap_mean(rows[0]["difference"])


def _falls_line(rows: list[dict[str, Any]]) -> str:
    falls = {r["seed"]: r["ours_best"] - r["after"]["ours"] for r in rows}
    return (
        f"ours ends within 5 points of its best snapshot: {_verdict(max(falls.values()) <= 0.05)} "
        f"(falls {', '.join(f'seed {s} {100 * v:.1f}' for s, v in falls.items())})"
    )


def target_lines(rows: list[dict[str, Any]], difference: Interval) -> list[str]:
    """Issue 46's targets for one task's seeds (against TRL at its validation-chosen
    settings; ``difference`` is ``task_difference(rows)``), each met or missed with its figures."""
    over = "seeds, then problems" if len(rows) >= 2 else f"seed {rows[0]['seed']}'s problems only"
    return [
        f"ours ahead, interval above 0: {_verdict(difference.low > 0)} "
        f"({_points(difference)}, resampling {over})",
        f"ours - TRL >= +5: {_verdict(difference.estimate >= 0.05)} ({_points(difference)})",
        _falls_line(rows),
    ]


def grid_target_lines(
    by_task: dict[str, list[dict[str, Any]]], differences: dict[str, Interval]
) -> list[str]:
    """Issue 46's targets over the whole grid (``differences``: each task's
    ``task_difference``): ahead with the interval above 0 on every task, ours - TRL >= +5 on at
    least two tasks, no run of ours more than 5 points below its best."""
    behind = [task for task, d in differences.items() if d.low <= 0]
    five = [task for task, d in differences.items() if d.estimate >= 0.05]
    falls = [r["ours_best"] - r["after"]["ours"] for rows in by_task.values() for r in rows]
    return [
        f"grid: ours ahead with the interval above 0 on every task: {_verdict(not behind)}"
        + (f" (not on {', '.join(behind)})" if behind else f" ({len(differences)} tasks)"),
        f"grid: ours - TRL >= +5 on at least two tasks: {_verdict(len(five) >= 2)} "
        f"({', '.join(five) or 'none'})",
        f"grid: no run of ours ends more than 5 points below its best snapshot: "
        f"{_verdict(max(falls) <= 0.05)} "
        f"(largest fall {100 * max(falls):.1f} of {len(falls)} runs)",
    ]


def issue35_target_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 35's targets (the grid of docs/learning-vs-trl/grid) for one task's seeds."""
    per_seed = {r["seed"]: bootstrap_mean(r["difference"]).estimate for r in rows}
    reach = {r["seed"]: r["minutes_to_trl"] for r in rows}
    halves = {r["seed"]: r["trl_minutes"] / 2 for r in rows}
    in_half = all(reach[s] is not None and reach[s] <= halves[s] for s in reach)
    reached = [
        f"seed {s} {'not reached' if m is None else f'{m:.1f} min'} (half: {halves[s]:.1f})"
        for s, m in reach.items()
    ]
    out = [
        _falls_line(rows),
        f"ours - TRL >= +5 on every seed: {_verdict(min(per_seed.values()) >= 0.05)} "
        f"({', '.join(f'seed {s} {100 * v:+.1f}' for s, v in per_seed.items())})",
        f"ours reaches TRL's final in half TRL's time: {_verdict(in_half)} ({', '.join(reached)})",
    ]
    if len(rows) >= 2:
        pooled = task_difference(rows)
        met = pooled.estimate >= 0.10 and pooled.low > 0
        out.insert(1, f"pooled ours - TRL >= +10, interval above 0: {_verdict(met)} "
                      f"({_points(pooled)})")  # fmt: skip
    return out


def missing_cells(
    summaries: list[dict[str, Any]], tasks: list[str], seeds: tuple[int, ...] = GRID_SEEDS
) -> list[str]:
    """The grid's task x seed cells with no finished run of both systems."""
    done = {(s["task"], s["seed"]) for s in summaries if set(SYSTEMS) <= set(s["systems"])}
    return [f"{t}-seed{seed}" for t in tasks for seed in seeds if (t, seed) not in done]


def expected_cells(summaries: list[dict[str, Any]]) -> tuple[list[str], tuple[int, ...]]:
    """Issue 46's grid (every task, GRID_SEEDS) for cells with independent seeds (their
    summaries name them), else issue 35's."""
    if summaries and all("seeds" in s for s in summaries):
        return list(TASKS), GRID_SEEDS
    return list(OLD_GRID[0]), OLD_GRID[1]


def plot_curves(summaries: list[dict[str, Any]], path: Path) -> None:
    """Held-out strict accuracy against minutes, one panel per task, every seed and system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({s["task"] for s in summaries})
    figure, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    colors = {"ours": "tab:blue", "trl": "tab:orange", "trl_defaults": "tab:gray"}
    line_styles = ("-", "--", ":", "-.")  # one per seed of a task
    for axis, task in zip(axes[0], tasks, strict=True):
        task_summaries = sorted((s for s in summaries if s["task"] == task),
                                key=lambda s: s["seed"])  # fmt: skip
        for index, summary in enumerate(task_summaries):
            for system, record in summary["systems"].items():
                xs = [0.0] + [p["minutes"] for p in record["curve"]]
                ys = [100 * summary["base"]["strict"]] + [
                    100 * p["strict"] for p in record["curve"]
                ]
                axis.plot(xs, ys, marker="o", color=colors.get(system), alpha=0.8,
                          linestyle=line_styles[index % len(line_styles)],
                          label=f"{system} seed {summary['seed']}")  # fmt: skip
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
        help="Also write the table between the grid-table markers of docs/results.md (and "
        "of README.md, when it has some).",
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
    missing = missing_cells(summaries, *expected_cells(summaries))
    table += "\n\n" + (f"missing from the grid: {', '.join(missing)}" if missing
                        else "the grid is complete")  # fmt: skip
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".txt").write_text(table + "\n")
        plot_curves(summaries, args.out.with_suffix(".png"))
        print(f"wrote {args.out.with_suffix('.txt')} and {args.out.with_suffix('.png')}")
    if args.docs:
        if len(args.runs) != 1:
            parser.error("--docs takes one run folder: the one the pages' markers name")
        source = marker_source(args.runs[0])
        pages = [(page, text) for page, text in ((RESULTS_PAGE, results_block(table)),
                                                 (README, readme_block(table)))
                 if BLOCK.search(page.read_text())]  # fmt: skip
        filled = [page for page, text in pages if fill_block(page, text, source)]
        if not filled:
            raise SystemExit(f"no page has a grid table of {source}: add "
                             f"'<!-- grid table: benchmarks/learning_pool.py {source} -->' and "
                             "'<!-- end of grid table -->' where it goes")  # fmt: skip
        print(f"filled the grid table of {source} in {', '.join(map(str, filled))}")
    return 0


BLOCK_END = "<!-- end of grid table -->"
BLOCK = re.compile(
    r"(?P<start><!-- grid table: benchmarks/learning_pool.py(?: (?P<source>\S+))? -->\n)"
    r"(?:.*?\n)?" + re.escape(BLOCK_END),
    re.S,
)
"""A page's grid table; its marker names the run folder it shows (none: issue 35's, GRID)."""
README = REPO / "README.md"
RESULTS_PAGE = REPO / "docs" / "results.md"


def results_block(table: str) -> str:
    """docs/results.md's grid: the per-cell table, then each task's lines as a list."""
    lines = table.splitlines()
    rows = [line for line in lines if line.startswith("|")]
    notes = [line for line in lines[1:] if line.strip() and not line.startswith("|")]
    listed = [f"  - {n.strip()}" if n.startswith("  ") else f"- {n}" for n in notes]
    return "\n".join(rows) + "\n\n" + "\n".join(listed)


README_COLUMNS = {"task": "task", "seed": "seed", "before": "before",
                  "ours after (gain)": "ours after", "TRL after (gain)": "TRL after",
                  "TRL at defaults after (gain)": "TRL at defaults after",
                  "ours - TRL": "ours - TRL, strict points",
                  "ours - TRL at defaults": "ours - TRL at defaults"}  # fmt: skip
"""The full table's columns the README keeps (accuracies without their gains), renamed."""


def readme_block(table: str) -> str:
    """The README's grid: before and after per cell, ours - TRL (and TRL at its defaults where
    the cells ran it), the pooled lines."""
    header, _, *cells = [line for line in table.splitlines() if line.startswith("|")]

    def split(row: str) -> list[str]:
        return [c.strip() for c in row.strip("|").split("|")]

    names = split(header)
    kept = [i for i, name in enumerate(names) if name in README_COLUMNS]
    out = ["| " + " | ".join(README_COLUMNS[names[i]] for i in kept) + " |",
           "|" + "---|" * len(kept)]  # fmt: skip
    for row in cells:
        values = split(row)
        out.append("| " + " | ".join(values[i].split(" (")[0] for i in kept) + " |")
    pooled = [
        line
        for line in table.splitlines()
        if ", pooled over seeds" in line or line.startswith(("missing from", "the grid is"))
    ]
    return "\n".join(out) + ("\n\n" + "\n".join(f"- {p}" for p in pooled) if pooled else "")


def marker_source(run_folder: Path) -> str:
    """How a page's marker names ``run_folder``: its path from the repository's root."""
    folder = run_folder.resolve()
    return str(folder.relative_to(REPO)) if folder.is_relative_to(REPO) else str(folder)


def fill_block(page: Path, text: str, source: str = marker_source(GRID)) -> bool:
    """Replaces what lies between the page's grid-table markers of ``source`` (a run folder as
    ``marker_source`` names it) with ``text``; False when the page has none of that folder."""
    content = page.read_text()
    if not BLOCK.search(content):
        raise SystemExit(f"{page}: no grid-table markers (<!-- grid table: ... -->) to fill")
    filled = False

    def replace(match: re.Match[str]) -> str:
        nonlocal filled
        if (match.group("source") or marker_source(GRID)) != source:
            return match.group(0)
        filled = True
        return f"{match.group('start')}{text}\n{BLOCK_END}"

    replaced = BLOCK.sub(replace, content)
    if filled:
        page.write_text(replaced)
    return filled


if __name__ == "__main__":
    raise SystemExit(main())
