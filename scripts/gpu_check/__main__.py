"""``scripts/gpu-check prepare | run`` (see the package docstring)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREPARED = ROOT / ".gpu-check"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-check",
        description="Check the trainer, the embedded server and weight pushes on one GPU.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare", help="download what the node lacks (needs PyPI)")
    prep.add_argument("--dest", type=Path, default=PREPARED, help="default: .gpu-check/")
    prep.add_argument("--python-version", default="3.12", help="the node's Python (3.12)")
    go = commands.add_parser("run", help="run the check (on the node; no network)")
    go.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    go.add_argument("--out", type=Path, required=True, help="folder for gpu-check.json/.log")
    go.add_argument("--prepared", type=Path, default=PREPARED, help="default: .gpu-check/")
    go.add_argument("--budget-s", type=float, default=None,
                    help="whole run's time (default: 480 on cuda, 1200 on cpu)")  # fmt: skip
    go.add_argument("--steps", default=None, help="comma-separated subset of the steps")
    go.add_argument(
        "--peak-tflops", type=float, default=None, help="dense bf16 peak of a card not listed"
    )
    args = parser.parse_args(argv)
    if args.command == "prepare":
        from gpu_check.prepare import prepare

        return prepare(args.dest, ROOT, args.python_version)
    if not (args.prepared / "manifest.json").is_file():
        print(f"gpu-check: error: {args.prepared} is not prepared; run `scripts/gpu-check "
              "prepare` on a machine with PyPI first", file=sys.stderr)  # fmt: skip
        return 2
    from gpu_check.runner import PLAN, run

    only = args.steps.split(",") if args.steps else None
    unknown = sorted(set(only or []) - {s.name for s in PLAN})
    if unknown:
        print(f"gpu-check: error: --steps: no step {', '.join(unknown)}; choose from "
              f"{', '.join(s.name for s in PLAN)}", file=sys.stderr)  # fmt: skip
        return 2
    budget = args.budget_s or (480.0 if args.device == "cuda" else 1200.0)
    return run(args.device, args.out, args.prepared, budget, only, args.peak_tflops)


if __name__ == "__main__":
    sys.exit(main())
