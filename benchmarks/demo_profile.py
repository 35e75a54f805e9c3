"""Where a demo step's time goes (issue 44): ``atropos-local`` run for N steps, each step split.

    python benchmarks/demo_profile.py --steps 12 --eval-size 0          # this checkout
    python benchmarks/demo_profile.py --baseline-tree /tmp/base         # the whole demo, then
                                                                        # the same on another tree

Runs ``atropos-local`` (broker, embedded inference server, reasoning-gym env, GRPO trainer) as
``scripts/demo`` does and samples every ``--poll-s`` seconds, from outside the processes:

- the CPU seconds of each process (``/proc/<pid>/stat``), so each one's busy and idle time;
- the lines the env appends to ``rollouts.jsonl`` (every group it sampled, the ones dropped
  as all-equal marked), stamped when they appear;
- the trainer's ``metrics.jsonl``: its wait for a batch (``train/data_wait_s``), and from
  trainers that log them, forward/backward, optimizer, checkpoint, weight write and push.

Per trainer step (the time since the previous step ended) it prints the trainer's parts, the
inference server's busy seconds with the groups it finished in the step (sent / dropped) and
the share of its busy time that went to dropped groups, measured two ways: its CPU seconds
split by the tokens each group made it process (its whole prompt once, its replies: issue 44's
measure), and the seconds the server itself reports in steps (``/health``), its prefill split by
each group's own prompt tokens (after the beginning every prompt shares, which the server
computes once per weights) and its decode by reply tokens; and the env's and broker's CPU seconds
(the env's holds its scoring, chat templates and HTTP client). Then the run's phases (start,
held-out evaluations, training, stop) and the totals. ``--baseline-tree`` runs the same
command on another checkout first (its ``atroposlib`` through ``PYTHONPATH``, this venv), then
this one, and prints the ratios; the held-out gains of both come from their ``summary.json``.
A run's numbers: ``--out FILE`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.machine import cpu_facts  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
ROLES = ("trainer", "inference", "env", "broker", "eval")
TRAINER_PARTS = (
    ("train/data_wait_s", "wait"),
    ("time/forward_backward_s", "fwd+bwd"),
    ("time/optimizer_s", "optim"),
    ("time/checkpoint_s", "ckpt"),
    ("sync/write_seconds", "write"),
    ("sync/seconds", "push"),
)


def role_of(argv: list[str]) -> str | None:
    """Which part of the loop a process of the run is, from its command line."""
    text = " ".join(argv)
    if "example_trainer.train" in text:
        return "trainer"
    if "atroposlib.inference" in text or "vllm.entrypoints" in text:
        return "inference"
    if "atroposlib.api" in text:
        return "broker"
    if "env.py" in text or "environments/" in text:
        return "eval" if " evaluate" in text else "env"
    return None


def process_table() -> dict[int, tuple[int, float, list[str]]]:
    """pid -> (parent pid, CPU seconds, argv) of every process this user can read."""
    table: dict[int, tuple[int, float, list[str]]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited while we looked
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime
        table[int(entry.name)] = (int(fields[1]), cpu, [a.decode(errors="replace") for a in argv])
    return table


def descendants(table: dict[int, tuple[int, float, list[str]]], root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


@dataclass
class Tail:
    """Complete JSON lines appended to a file since the last read."""

    path: Path
    offset: int = 0

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            text = handle.read()
        complete, _, _ = text.rpartition(b"\n")
        if not complete:
            return []
        self.offset += len(complete) + 1
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


@dataclass
class Trace:
    """What one run looked like from outside, sample by sample."""

    started: float
    cpu: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    """(time, CPU seconds per role so far, exited processes included)."""
    lifetimes: dict[int, list[Any]] = field(default_factory=dict)
    """pid -> [role, first seen, last seen]."""
    groups: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    metrics: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    health: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    """The embedded inference server's ``/health`` counters (decode steps, computed rows)."""
    ended: float = 0.0

    def seen(self, role: str) -> list[tuple[float, float]]:
        """(first, last) seen of each process of ``role``, in start order."""
        return sorted((first, last) for r, first, last in self.lifetimes.values() if r == role)


def watch(process: subprocess.Popen[bytes], run_dir: Path, poll_s: float) -> Trace:
    """Sample the run until ``process`` (atropos-local) exits."""
    trace = Trace(time.time())
    rollouts, metrics = Tail(run_dir / "rollouts.jsonl"), Tail(run_dir / "metrics.jsonl")
    last_cpu: dict[int, tuple[str, float]] = {}  # pid -> (role, CPU seconds last seen)
    health_url = None
    while True:
        running = process.poll() is None
        now, table = time.time(), process_table()
        for pid in descendants(table, process.pid):
            role = role_of(table[pid][2])
            if role is not None:
                last_cpu[pid] = (role, table[pid][1])
                trace.lifetimes.setdefault(pid, [role, now, now])[2] = now
            if role == "inference" and health_url is None:
                health_url = inference_health_url(table[pid][2])
        if health_url is not None and running:
            counters = read_health(health_url)
            if counters:
                trace.health.append((now, counters))
        totals = dict.fromkeys(ROLES, 0.0)
        for role, cpu in last_cpu.values():
            totals[role] += cpu
        trace.cpu.append((now, totals))
        trace.groups += [(now, g) for g in rollouts.read()]
        trace.metrics += [(now, m) for m in metrics.read()]
        if not running:
            trace.ended = now
            return trace
        time.sleep(poll_s)


def inference_health_url(argv: list[str]) -> str | None:
    """``/health`` of the server started with ``argv`` (its ``--port``), on loopback."""
    if "--port" not in argv:
        return None
    return f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/health"


def read_health(url: str) -> dict[str, Any]:
    """The server's counters, or nothing (not up yet, busy past the timeout, or vLLM's empty
    answer)."""
    try:
        answer = httpx.get(url, timeout=0.5)
        body = answer.json() if answer.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}
    return body if isinstance(body, dict) and "decode_steps" in body else {}


def counters_at(trace: Trace, moment: float) -> dict[str, Any]:
    """The last ``/health`` counters read at or before ``moment`` (nothing before the first)."""
    best: dict[str, Any] = {}
    for when, counters in trace.health:
        if when > moment:
            break
        best = counters
    return best


def cpu_at(trace: Trace, moment: float) -> dict[str, float]:
    """CPU seconds per role at ``moment`` (the last sample at or before it)."""
    best = trace.cpu[0][1]
    for when, totals in trace.cpu:
        if when > moment:
            break
        best = totals
    return best


def group_cost(group: dict[str, Any]) -> tuple[int, int]:
    """(tokens the server processed for the group: its prompt once and its replies; reply
    tokens). The prompt is what precedes the first trained token of the first sequence."""
    masks, tokens = group["masks"], group["tokens"]
    replies = sum(sum(1 for m in mask if m != -100) for mask in masks)
    prompt = next((i for i, m in enumerate(masks[0]) if m != -100), len(tokens[0]))
    return prompt + replies, replies


def prompt_of(group: dict[str, Any]) -> list[int]:
    """The tokens before the first trained token of the group's first sequence."""
    mask, tokens = group["masks"][0], group["tokens"][0]
    return list(tokens[: next((i for i, m in enumerate(mask) if m != -100), len(tokens))])


def shared_beginning(groups: list[dict[str, Any]]) -> int:
    """Tokens every group's prompt begins with (the worked examples and the chat template):
    the embedded server computes them once per weights and continues each prompt after them."""
    prompts = [prompt_of(group) for group in groups]
    if not prompts:
        return 0
    shortest = min(len(prompt) for prompt in prompts)
    for position in range(shortest):
        if len({prompt[position] for prompt in prompts}) > 1:
            return position
    return shortest


def on_dropped(prefill_s: float, decode_s: float, parts: list[tuple[int, int, bool]]) -> float:
    """Server seconds spent on dropped groups: its prefill split by each group's own prompt
    tokens (after the shared beginning), its decode by each group's reply tokens."""
    tails = sum(tail for tail, _, _ in parts) or 1
    replies = sum(reply for _, reply, _ in parts) or 1
    return (
        prefill_s * sum(t for t, _, d in parts if d) / tails
        + decode_s * sum(r for _, r, d in parts if d) / replies
    )


def step_rows(trace: Trace) -> list[dict[str, Any]]:
    """One row per trainer step: its window (since the previous step ended) and its parts."""
    shared = shared_beginning([group for _, group in trace.groups])
    by_step: dict[int, dict[str, Any]] = {}
    seen_at: dict[int, float] = {}
    for when, row in trace.metrics:
        step = row.get("step")
        if step is not None:
            by_step.setdefault(step, {}).update(row)
            seen_at[step] = when
    trainers = trace.seen("trainer")
    previous_end = trainers[0][0] if trainers else trace.started
    rows = []
    for step in sorted(by_step):
        row = by_step[step]
        start, end = previous_end, float(row.get("time/step_end_unix_s") or seen_at[step])
        previous_end = end
        before, after = cpu_at(trace, start), cpu_at(trace, end)
        busy = {role: after[role] - before[role] for role in ROLES}
        finished = [g for when, g in trace.groups if start < when <= end]
        costs = [(*group_cost(g), bool(g.get("dropped"))) for g in finished]
        processed = sum(cost for cost, _, _ in costs) or 1
        parts = {label: float(row[key]) for key, label in TRAINER_PARTS if key in row}
        wall = end - start
        first, last = counters_at(trace, start), counters_at(trace, end)
        server = {
            key: float(last.get(key, 0)) - float(first.get(key, 0))
            for key in ("decode_steps", "computed_rows", "busy_seconds", "prefill_seconds")
        }
        running = [c["sequences_running"] for when, c in trace.health if start < when <= end]
        own = [
            (len(prompt_of(g)) - shared, r, d) for g, (_, r, d) in zip(finished, costs, strict=True)
        ]
        prefill_s = server["prefill_seconds"]
        rows.append(
            {
                "step": step,
                "wall_s": wall,
                "trainer_parts_s": parts,
                "server": {
                    **server,
                    "rows_per_decode": server["computed_rows"] / max(server["decode_steps"], 1),
                    "rows_running": sum(running) / max(len(running), 1),
                },
                "cpu_s": busy,
                "groups_sent": sum(not dropped for _, _, dropped in costs),
                "groups_dropped": sum(dropped for _, _, dropped in costs),
                "reply_tokens_sent": sum(r for _, r, dropped in costs if not dropped),
                "reply_tokens_dropped": sum(r for _, r, dropped in costs if dropped),
                "inference_s_on_dropped": busy["inference"]
                * sum(cost for cost, _, dropped in costs if dropped)
                / processed,
                "server_s_on_dropped": on_dropped(
                    prefill_s, server["busy_seconds"] - prefill_s, own
                ),
            }
        )
    return rows


def phases(trace: Trace) -> dict[str, float]:
    """Seconds of the run's phases, from when each process was first and last seen."""
    out = {"whole_run": trace.ended - trace.started}
    trainers, evals = trace.seen("trainer"), trace.seen("eval")
    if not trainers:
        return out
    train_start, train_end = trainers[0][0], trainers[-1][1]
    before = [e for e in evals if e[0] < train_start]
    after = [e for e in evals if e[0] >= train_end]
    out["start_up"] = (before[0][0] if before else train_start) - trace.started
    out["eval_before"] = sum(last - first for first, last in before)
    out["training"] = train_end - train_start
    out["eval_after"] = sum(last - first for first, last in after)
    out["rest"] = out["whole_run"] - sum(v for k, v in out.items() if k != "whole_run")
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Means per step over ``rows`` (the first step, which waits for the first batch, apart)."""
    steady = rows[1:] or rows
    n = max(len(steady), 1)

    def mean(get: Any) -> float:
        return sum(get(r) for r in steady) / n

    out = {"steps": float(len(rows)), "wall_s_per_step": mean(lambda r: r["wall_s"])}
    for _, label in TRAINER_PARTS:
        if any(label in r["trainer_parts_s"] for r in steady):
            out[f"trainer_{label}_s"] = mean(lambda r, k=label: r["trainer_parts_s"].get(k, 0.0))
    for role in ("trainer", "inference", "env", "broker"):
        out[f"{role}_cpu_s"] = mean(lambda r, k=role: r["cpu_s"][k])
        out[f"{role}_idle_s"] = mean(lambda r, k=role: max(0.0, r["wall_s"] - r["cpu_s"][k]))
    out["inference_s_on_dropped"] = mean(lambda r: r["inference_s_on_dropped"])
    out["dropped_cpu_share"] = sum(r["inference_s_on_dropped"] for r in steady) / max(
        sum(r["cpu_s"]["inference"] for r in steady), 1e-9
    )
    out["server_s_on_dropped"] = mean(lambda r: r["server_s_on_dropped"])
    out["dropped_busy_share"] = sum(r["server_s_on_dropped"] for r in steady) / max(
        sum(r["server"]["busy_seconds"] for r in steady), 1e-9
    )
    out["inference_in_steps_s"] = mean(lambda r: r["server"]["busy_seconds"])
    out["inference_prefill_s"] = mean(lambda r: r["server"]["prefill_seconds"])
    out["inference_decode_steps"] = mean(lambda r: r["server"]["decode_steps"])
    decode_steps = sum(r["server"]["decode_steps"] for r in steady) or 1
    out["rows_computed_per_decode"] = (
        sum(r["server"]["computed_rows"] for r in steady) / decode_steps
    )
    out["rows_running"] = mean(lambda r: r["server"]["rows_running"])
    sent = sum(r["groups_sent"] for r in steady)
    dropped = sum(r["groups_dropped"] for r in steady)
    out["groups_sent_per_step"] = sent / n
    out["groups_dropped_per_step"] = dropped / n
    out["dropped_share"] = dropped / max(sent + dropped, 1)
    return out


def held_out(run_dir: Path) -> dict[str, Any]:
    """Held-out strict accuracy before/after, flips and the gain's 95 % interval (summary.json)."""
    path = run_dir / "summary.json"
    if not path.exists():
        return {}
    strict = (json.loads(path.read_text()).get("held_out_eval") or {}).get("strict") or {}
    if "before" not in strict:
        return {}
    return {**strict, "gain": strict["after"] - strict["before"]}


def run_once(tree: Path, run_dir: Path, local_args: list[str], poll_s: float) -> dict[str, Any]:
    """One ``atropos-local`` run of ``tree`` watched to its end; its rows and phases."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "WANDB_MODE": "offline"}  # fmt: skip
    argv = [sys.executable, "-m", "atroposlib.cli.local", "--run-dir", str(run_dir),
            "--no-panel", *local_args]  # fmt: skip
    log = run_dir.with_suffix(".log")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        # cwd too: `python -m` puts the working directory ahead of PYTHONPATH
        process = subprocess.Popen(argv, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
        trace = watch(process, run_dir, poll_s)
    if process.returncode != 0:
        raise RuntimeError(f"atropos-local on {tree} exited {process.returncode}; see {log}")
    rows = step_rows(trace)
    return {
        "tree": str(tree),
        "commit": commit_of(tree),
        "run_dir": str(run_dir),
        "phases_s": phases(trace),
        "per_step": summarize(rows),
        "held_out_strict": held_out(run_dir),
        "steps": rows,
    }


def commit_of(tree: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def step_table(rows: list[dict[str, Any]]) -> list[str]:
    labels = [
        label for _, label in TRAINER_PARTS if any(label in r["trainer_parts_s"] for r in rows)
    ]
    head = "step  wall | trainer: " + " ".join(f"{x:>7}" for x in labels)
    head += (" | inference CPU  on dropped | server busy  on dropped | rows run/computed"
             " | groups sent/dropped | env broker")  # fmt: skip
    lines = [head]
    for r in rows:
        parts = " ".join(f"{r['trainer_parts_s'].get(x, 0.0):7.2f}" for x in labels)
        lines.append(
            f"{r['step']:>4} {r['wall_s']:5.1f} | trainer: {parts} | "
            f"{r['cpu_s']['inference']:13.1f} {r['inference_s_on_dropped']:11.1f} | "
            f"{r['server']['busy_seconds']:11.1f} {r['server_s_on_dropped']:11.1f} | "
            f"{r['server']['rows_running']:9.1f}/{r['server']['rows_per_decode']:<8.1f} | "
            f"{r['groups_sent']:>10}/{r['groups_dropped']:<8} | "
            f"{r['cpu_s']['env']:3.1f} {r['cpu_s']['broker']:6.1f}"
        )
    return lines


def report(result: dict[str, Any], show_steps: bool) -> list[str]:
    lines = [f"== {result['tree']} ({result['commit']}), run folder {result['run_dir']}"]
    if show_steps:
        lines += step_table(result["steps"])
    lines.append("phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in result["phases_s"].items()))
    lines.append(
        "per step, means after step 1 (s): "
        + ", ".join(
            f"{k} {v:.2f}" if isinstance(v, float) and k != "steps" else f"{k} {v:.0f}"
            for k, v in result["per_step"].items()
        )
    )
    if result["held_out_strict"]:
        lines.append(f"held-out strict: {result['held_out_strict']}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="trainer steps (the demo's 40)")
    parser.add_argument(
        "--eval-size", type=int, default=200, help="held-out problems before/after (0: none)"
    )
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout to run (this one)")
    parser.add_argument(
        "--baseline-tree", type=Path, default=None, help="another checkout, run first"
    )
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/demo_profile"))
    parser.add_argument("--poll-s", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--no-steps", action="store_true", help="omit the per-step table")
    parser.add_argument("--out", type=Path, default=None, help="write every figure as JSON")
    args, extra = parser.parse_known_args()
    local_args = ["--steps", str(args.steps), "--eval-size", str(args.eval_size), *extra]
    trees = {"ours": args.tree.resolve()}
    if args.baseline_tree is not None:
        trees = {"baseline": args.baseline_tree.resolve(), **trees}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    results: dict[str, Any] = {"cpu": cpu_facts(), "command": sys.argv, "runs": {}}
    print(f"cpu: {results['cpu']}")
    for name, tree in trees.items():
        run_dir = args.work_dir / f"{name}-{stamp}"
        result = run_once(tree, run_dir, local_args, args.poll_s)
        results["runs"][name] = result
        print("\n".join(report(result, not args.no_steps)), flush=True)
    if "baseline" in results["runs"]:
        base, ours = results["runs"]["baseline"], results["runs"]["ours"]
        ratios = {
            "whole_run": base["phases_s"]["whole_run"] / ours["phases_s"]["whole_run"],
            "wall_s_per_step": base["per_step"]["wall_s_per_step"]
            / ours["per_step"]["wall_s_per_step"],
        }
        results["speedup"] = ratios
        print(
            f"speed-up, baseline / ours: whole run {ratios['whole_run']:.2f}x "
            f"({base['phases_s']['whole_run']:.0f} s -> {ours['phases_s']['whole_run']:.0f} s), "
            f"per step {ratios['wall_s_per_step']:.2f}x"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
