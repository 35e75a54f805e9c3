"""Optimizer-step throughput: naive padding vs length bucketing vs sequence packing.

One GRPO optimizer step (forward + backward over every micro-batch, AdamW step) on the test
model (SmolLM2-135M-Instruct, CPU, fp32) for a batch with a realistic, long-tailed mix of
sequence lengths. Every mode has the same micro-batch token budget:

- naive: rows in arrival order, every row padded to the longest sequence of the batch;
- bucketed: rows sorted by length, grouped greedily so rows x longest row <= budget;
- packed: whole sequences back to back in rows (first-fit decreasing; the trainer's
  default row length, the power of two >= the longest sequence, several rows per
  micro-batch), position_ids restarting per sequence, block-diagonal attention; logits and
  log-softmax at every position, as the padded modes (the gain from less padding alone);
- packed_trained_logits: packed, and the vocabulary projection + log-softmax only at trained
  positions (the trainer's default; prompts are never trained);
- prefix_shared: packed_trained_logits, but the replies to one prompt follow a single computed
  copy of it (example_trainer/prefix_sharing.py: trees of prefix + suffixes in the rows, a
  custom attention mask).

``--shape long-tail`` (default): prompts of 40-120 tokens, long-tailed replies of 16-448;
``--shape grpo``: prompts of 150-200 tokens, replies of 40-60, as a GRPO math env sends them.
Every batch is groups of 4 replies to one prompt. "computed" counts the positions the forward
runs (rows x widest row, padding included; a shared prompt once).

Each mode runs in its own process (clean peak memory); the first step's loss must match
naive's. Wall-clock tokens/s is what a user sees; tokens per CPU second is also printed
because on a shared machine other processes skew wall-clock time between runs.

    python benchmarks/trainer_step.py [--seqs 32] [--budget 1024] [--steps 1] [--repeat 1]
        [--shape long-tail|grpo] [--modes naive,packed_trained_logits,prefix_shared]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from example_trainer.config import LossConfig
from example_trainer.data import (
    batch_to_samples,
    batch_totals,
    collate,
    padded_tokens,
    plan_microbatches,
)
from example_trainer.loss import LossInputs, grpo_loss
from example_trainer.prefix_sharing import collate_trees
from example_trainer.sequence_packing import (
    collate_packed,
    model_logprobs,
    packed_costs,
    plan_packed,
    row_length,
    tree_plan,
)

MODES = ("naive", "bucketed", "packed", "packed_trained_logits", "prefix_shared")


def make_groups(n_seqs: int, group_size: int, seed: int, shape: str = "long-tail") -> list[dict]:
    """Groups of replies to one prompt each. long-tail: prompts of 40-120 tokens, replies
    lognormal (16-448 tokens); grpo: prompts of 150-200 tokens, replies of 40-60."""
    rng = np.random.default_rng(seed)
    grpo = shape == "grpo"
    groups = []
    for _ in range(n_seqs // group_size):
        prompt_len = int(rng.integers(150, 201) if grpo else rng.integers(40, 120))
        prompt = rng.integers(100, 40000, size=prompt_len)
        tokens, masks = [], []
        for _ in range(group_size):
            n = int(rng.integers(40, 61) if grpo else np.clip(rng.lognormal(4.3, 0.8), 16, 448))
            t = np.concatenate([prompt, rng.integers(100, 40000, size=n)]).astype(np.int32)
            m = t.copy()
            m[: len(prompt)] = -100
            tokens.append(t)
            masks.append(m)
        scores = rng.integers(0, 2, size=group_size).astype(float)
        scores[0] = 1.0 - scores[1]  # never a zero-variance group
        groups.append({"tokens": tokens, "masks": masks, "scores": scores.tolist(), "env_id": 0})
    return groups


def run_mode(mode: str, args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM

    from atroposlib.utils.test_model import ensure_test_model

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(str(ensure_test_model()), dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    cfg = LossConfig()
    samples, _, _ = batch_to_samples(make_groups(args.seqs, 4, args.seed, args.shape), cfg)
    totals = batch_totals(samples)
    lengths = [len(s.tokens) for s in samples]
    packed = mode.startswith("packed")
    plan: list[Any]
    if mode == "prefix_shared":  # as the trainer plans it
        trees = tree_plan(samples, args.budget, args.row_tokens)
        plan, padded = trees.entries, sum(trees.costs)
    elif packed:
        row_tokens = args.row_tokens or row_length(lengths, args.budget)
        plan = plan_packed(lengths, row_tokens, args.budget)
        padded = sum(packed_costs(plan, lengths))
    else:
        plan = plan_microbatches(lengths, args.budget, bucket=(mode == "bucketed"))
        padded = padded_tokens(plan, lengths) if mode == "bucketed" else len(lengths) * max(lengths)
    losses, times, cpu_times = [], [], []
    entry: Any  # a micro-batch: rows of trees, rows of sequence indices, or indices
    for _ in range(args.steps):
        start, cpu_start, loss_sum = time.perf_counter(), time.process_time(), 0.0
        for entry in plan:
            if mode == "prefix_shared":  # entry: rows of trees
                mb = collate_trees(entry, samples)
            elif packed:  # entry: rows of sequence indices
                rows = [[samples[i] for i in row] for row in entry]
                mb = collate_packed(rows, trained_only=(mode == "packed_trained_logits"))
            else:
                pad_to = max(lengths) if mode == "naive" else None
                mb = collate([samples[i] for i in entry], pad_to=pad_to)
            logp, entropy = model_logprobs(model, mb)
            x = LossInputs(logp, entropy, mb.mask, mb.advantages, mb.sft)
            loss, _ = grpo_loss(x, cfg, totals, 1)
            loss.backward()
            loss_sum += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
        losses.append(loss_sum)
    step_s = float(np.mean(times[1:] if len(times) > 1 else times))
    cpu_s = float(np.mean(cpu_times[1:] if len(cpu_times) > 1 else cpu_times))
    return {
        "mode": mode,
        "micro_batches": len(plan),
        "tokens": sum(lengths),
        "trained_tokens": totals.tokens,
        "padded_tokens": padded,
        "step_s": step_s,
        "tokens_per_s": sum(lengths) / step_s,
        "cpu_s": cpu_s,
        "tokens_per_cpu_s": sum(lengths) / cpu_s,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "losses": losses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=32, help="sequences per step (groups of 4)")
    parser.add_argument("--budget", type=int, default=1024, help="tokens per micro-batch")
    parser.add_argument(
        "--steps", type=int, default=1, help="steps per mode (2+: first is warm-up)"
    )
    parser.add_argument(
        "--row-tokens",
        type=int,
        help="packed: tokens per row (default: power of two >= longest sequence, <= budget)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--shape",
        choices=("long-tail", "grpo"),
        default="long-tail",
        help="long-tail: prompts 40-120, replies 16-448 tokens; grpo: prompts 150-200, "
        "replies 40-60 (groups of 4 either way)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per mode (interleaved); the fastest is kept"
    )
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}"
    )
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args)))
        return
    modes = [m for m in args.modes.split(",") if m]
    if "naive" not in modes or any(m not in MODES for m in modes):
        parser.error(f"--modes must include naive and name only {', '.join(MODES)}")
    load_before = os.getloadavg()
    results: dict[str, dict] = {}
    for rep in range(args.repeat):  # modes interleaved, so a burst of load hits them alike
        for mode in modes:
            argv = [sys.executable, __file__, *sys.argv[1:], "--mode", mode]
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(f"# {mode} run {rep + 1}: {r['step_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU")
            best = results.setdefault(mode, r)
            for key, rate in (("step_s", "tokens_per_s"), ("cpu_s", "tokens_per_cpu_s")):
                if r[key] < best[key]:
                    best[key], best[rate] = r[key], r[rate]
            best["peak_rss_gb"] = max(best["peak_rss_gb"], r["peak_rss_gb"])
            sys.stdout.flush()
    load_after = os.getloadavg()
    n = results["naive"]
    print(f"load average (1/5/15 min) before {load_before}, after {load_after}")
    print(f"trained tokens per step: {n['trained_tokens']}")
    head = f"{'mode':<22}{'micro-batches':>14}{'tokens':>8}{'computed':>9}{'step s':>8}"
    print(head + f"{'tokens/s':>10}{'CPU s':>8}{'tokens/CPU s':>14}{'peak RSS GB':>13}  loss")
    for r in results.values():
        print(
            f"{r['mode']:<22}{r['micro_batches']:>14}{r['tokens']:>8}{r['padded_tokens']:>9}"
            f"{r['step_s']:>8.1f}{r['tokens_per_s']:>10.1f}{r['cpu_s']:>8.1f}"
            f"{r['tokens_per_cpu_s']:>14.1f}{r['peak_rss_gb']:>13.2f}  {r['losses'][0]:.8f}"
        )
    print(f"{'vs naive':<22}{'tokens/s (wall)':>16}{'tokens/CPU s':>14}{'computed':>9}"
          f"{'peak RSS':>10}{'loss |diff|':>13}")  # fmt: skip
    for r in results.values():
        if r is n:
            continue
        print(
            f"{r['mode']:<22}{r['tokens_per_s'] / n['tokens_per_s']:>15.2f}x"
            f"{r['tokens_per_cpu_s'] / n['tokens_per_cpu_s']:>13.2f}x"
            f"{n['padded_tokens'] / r['padded_tokens']:>8.2f}x"
            f"{r['peak_rss_gb'] / n['peak_rss_gb']:>9.2f}x"
            f"{abs(r['losses'][0] - n['losses'][0]):>13.1e}"
        )


if __name__ == "__main__":
    main()
