"""Seconds per held-out evaluation: ``env.py evaluate`` (what atropos-local runs before and
after training) against the embedded server, two ways one after the other in one run, and
whether the answers are the same:

- ``--compare prefill`` (default): the shared prompt beginning off (the old prefill), then on;
- ``--compare batch``: the server's default batch (64 rows, 64 evaluation requests at once),
  then every problem in one batch, at most 256 (what learning_vs_trl.py's evaluator uses).

    python benchmarks/held_out_eval.py                   # the demo's 200 problems
    python benchmarks/held_out_eval.py --eval-size 50 --threads 1
    python benchmarks/held_out_eval.py --compare batch --threads 2 \
        --env-config configs/local-cpu-three-sums-env.yaml --model runs/…/checkpoints/step-23

Each side starts its own server on a free port; the seconds are the evaluator's own
``total_evaluation_time_seconds`` (server start excluded). On a shared 2-core machine
wall-clock figures move with the load: compare the two sides of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from atroposlib.utils.test_model import ensure_test_model  # noqa: E402
from benchmarks.learning_systems import ONE_BATCH_MAX  # noqa: E402
from benchmarks.serving import served_evaluation  # noqa: E402


def evaluate(
    model: str,
    out: Path,
    args: argparse.Namespace,
    share: bool,
    env: dict[str, str] | None = None,
    batch: int | None = None,
) -> float:
    """Start a server, run ``env.py evaluate`` on it, stop it; the evaluation's seconds.
    ``batch``: the server's ``--max-batch-size`` and the env's concurrent evaluation requests
    (None: both defaults)."""
    flag = "--share-prompt-prefixes" if share else "--no-share-prompt-prefixes"
    server_batch = [] if batch is None else ["--max-batch-size", str(batch)]
    env_batch = [] if batch is None else ["--openai.num_requests_for_eval", str(batch)]
    served_evaluation(
        model, ROOT / args.env_config, out, eval_size=args.eval_size, threads=args.threads,
        max_token_length=256, server_flags=[flag, *server_batch], env_flags=env_batch, env=env,
    )  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    return float(metrics["config_general"]["total_evaluation_time_seconds"])


def replies(folder: Path) -> dict[str, str]:
    with (folder / "samples.jsonl").open() as handle:
        rows = [json.loads(line) for line in handle]
    return {row["problem"]: row["response"] for row in rows}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-size", type=int, default=200)
    parser.add_argument("--env-config", default="configs/local-cpu-env.yaml")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--compare", choices=["prefill", "batch"], default="prefill")
    parser.add_argument("--model", default=None, help="Folder to serve (default: test model).")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    model = args.model or str(ensure_test_model())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.compare == "prefill":
        labels = ("old prefill (every prompt whole)", "shared prompt beginning")
        (old_share, old_batch), (new_share, new_batch) = (False, None), (True, None)
    else:
        one_batch = min(args.eval_size, ONE_BATCH_MAX)
        labels = ("server's default batch (64)", f"batches of {one_batch}")
        (old_share, old_batch), (new_share, new_batch) = (True, None), (True, one_batch)
    with tempfile.TemporaryDirectory() as tmp:
        old = evaluate(model, Path(tmp) / "old", args, share=old_share, batch=old_batch)
        new = evaluate(model, Path(tmp) / "new", args, share=new_share, batch=new_batch)
        before, after = replies(Path(tmp) / "old"), replies(Path(tmp) / "new")
    same = sum(before[key] == after.get(key) for key in before)
    print(f"held-out eval, {args.eval_size} problems, {args.threads} torch thread(s), {model}")
    print(f"  {labels[0] + ':':<38}{old:6.1f} s")
    print(f"  {labels[1] + ':':<38}{new:6.1f} s   ({old / new:.2f}x)")
    print(f"  same replies: {same} / {len(before)}")


if __name__ == "__main__":
    main()
