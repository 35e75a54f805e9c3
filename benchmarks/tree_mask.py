"""prefix_shared collation: CPU seconds to lay a step's trees into rows and build their mask.

``micro_batching: prefix_shared`` lays each group's prompt once and its replies after it
(example_trainer/prefix_sharing.py) and builds an (R, W, W) tree attention mask on the CPU
for every micro-batch; that time is part of every optimizer step. Shapes:

- ``gpu``: the GPU check's timed batch (scripts/gpu_check/batches.py: 32 groups x 8 replies,
  prompts of 150-250 tokens, replies around 300, up to 1,500; 16,384-token micro-batches);
- ``demo``: about the demo's batch (4 groups x 4, prompts of 200-220 tokens, replies of 8-120;
  4,096-token micro-batches, configs/local-cpu-trainer.yaml).

Each tree runs in its own process, alternating, ``--repeat`` times; the figure is the median
of the collation seconds of the whole step (rows laid, mask built).

    python benchmarks/tree_mask.py                               # this checkout
    python benchmarks/tree_mask.py --baseline-tree /tmp/before   # and another one, side by side

``--baseline-tree``: a checkout whose ``example_trainer`` is measured, e.g. ``git archive
<commit> example_trainer | tar -x -C /tmp/before``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {  # batch shape (None: the GPU check's timed batch), micro-batch tokens, max_token_len
    "gpu": (None, 16384, 2048),
    "demo": ((4, 4, (200, 220), 40, (8, 120)), 4096, 256),
}


def child(tree: Path, shape: str, row_tokens: int | None) -> dict[str, float]:
    """One measurement in this process, importing ``example_trainer`` from ``tree``."""
    sys.path[:0] = [str(tree), str(ROOT / "scripts")]
    from gpu_check.batches import TIMED, BatchShape, make_groups

    from example_trainer.config import load_config
    from example_trainer.data import batch_to_samples
    from example_trainer.sequence_packing import micro_batch, micro_batch_plan

    batch, budget, max_len = SHAPES[shape]
    groups = make_groups(TIMED["cuda"] if batch is None else BatchShape(*batch), 49152, seed=2)
    extra = {"pack_row_tokens": row_tokens} if row_tokens else {}
    cfg = load_config(["--model", "unused", "--micro-batching", "prefix_shared"],
                      micro_batch_tokens=budget, max_token_len=max_len, **extra)  # fmt: skip
    samples, _, _ = batch_to_samples(copy.deepcopy(groups), cfg.loss)
    start = time.perf_counter()
    plan = micro_batch_plan(cfg, samples)
    batches = [micro_batch(cfg, samples, entry) for entry in plan.entries]
    seconds = time.perf_counter() - start
    masks = [b.packed.attention_mask for b in batches if b.packed is not None]
    return {
        "seconds": seconds,
        "micro_batches": len(batches),
        "tokens": plan.tokens,
        "mask_mib": sum(m.numel() for m in masks) / 2**20,
    }


def measure(tree: Path, shape: str, row_tokens: int | None) -> dict[str, float]:
    argv = [sys.executable, __file__, "--child", str(tree), "--shape", shape]
    if row_tokens:
        argv += ["--row-tokens", str(row_tokens)]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: both")
    parser.add_argument("--row-tokens", type=int, default=None, help="pack_row_tokens")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-tree", type=Path, default=None)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.shape, args.row_tokens)))
        return 0
    trees = {"this": args.tree.resolve()}
    if args.baseline_tree is not None:
        trees = {"baseline": args.baseline_tree.resolve(), **trees}
    for shape in [args.shape] if args.shape else list(SHAPES):
        runs: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
        for _ in range(args.repeat):
            for label, tree in trees.items():
                runs[label].append(measure(tree, shape, args.row_tokens))
        medians = {}
        for label, found in runs.items():
            medians[label] = statistics.median(r["seconds"] for r in found)
            last = found[-1]
            print(
                f"{shape} {label}: collation {medians[label]:.3f} s a step (median of "
                f"{len(found)}), {last['micro_batches']:.0f} micro-batches, "
                f"{last['tokens']:,.0f} tokens laid, mask {last['mask_mib']:,.0f} MiB"
            )
        if "baseline" in medians:
            print(f"{shape}: baseline / this {medians['baseline'] / medians['this']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
