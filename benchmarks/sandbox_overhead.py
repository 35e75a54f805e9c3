"""Cost of one sandboxed run of a trivial program, against a bare ``python -I -c`` subprocess.

    PYTHONPATH=. python benchmarks/sandbox_overhead.py [--runs 20]

Prints the median wall time per run for the baseline (a plain subprocess, no limits), the
audit-hook sandbox and the namespace sandbox (when this host allows it), and each ratio to
the baseline. Numbers on a shared machine are noisy; compare medians of the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from atroposlib.sandbox import Isolation, detect_isolation, run_python

PROGRAM = "print(sum(range(1000)))"


def median_seconds(run: Callable[[], object], runs: int) -> float:
    run()  # warm-up: page cache, the namespace probe
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="Timed runs per variant.")
    args = parser.parse_args()

    def baseline() -> object:
        return subprocess.run(
            [sys.executable, "-I", "-c", PROGRAM], capture_output=True, check=True
        )

    variants: dict[str, Callable[[], object]] = {"baseline subprocess": baseline}
    modes = [Isolation.AUDIT_HOOK]
    if detect_isolation() is Isolation.NAMESPACES:
        modes.append(Isolation.NAMESPACES)
    for mode in modes:
        variants[f"sandbox ({mode.value})"] = lambda m=mode: run_python(PROGRAM, isolation=m)
    base = None
    for name, run in variants.items():
        seconds = median_seconds(run, args.runs)
        base = base or seconds
        print(f"{name:<28} {seconds * 1000:8.1f} ms/run   x{seconds / base:5.2f} vs baseline")


if __name__ == "__main__":
    main()
