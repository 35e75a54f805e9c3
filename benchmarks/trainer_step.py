"""Optimizer-step throughput: token-budget micro-batching with length bucketing vs naive padding.

One GRPO optimizer step (forward + backward over every micro-batch, AdamW step) on the test
model (SmolLM2-135M-Instruct, CPU, fp32) for a batch with a realistic, long-tailed mix of
sequence lengths. Both modes share the micro-batch token budget:

- bucketed (ours): rows sorted by length, packed greedily so rows x longest row <= budget;
- naive: rows in arrival order, every row padded to the longest sequence of the batch.

Each mode runs in its own process (clean peak memory); the first step's loss must match.
Wall-clock tokens/s is what a user sees; tokens per CPU second is also printed because on a
shared machine other processes skew wall-clock time between the two runs.

    python benchmarks/trainer_step.py [--seqs 16] [--budget 1024] [--steps 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from example_trainer.config import LossConfig
from example_trainer.data import (
    batch_to_samples,
    batch_totals,
    collate,
    plan_microbatches,
)
from example_trainer.loss import LossInputs, grpo_loss, token_logprobs


def make_groups(n_seqs: int, group_size: int, seed: int) -> list[dict]:
    """Prompts of 40-120 tokens; completions long-tailed (lognormal, 16-448 tokens)."""
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(n_seqs // group_size):
        prompt = rng.integers(100, 40000, size=int(rng.integers(40, 120)))
        tokens, masks = [], []
        for _ in range(group_size):
            n = int(np.clip(rng.lognormal(4.3, 0.8), 16, 448))
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
    samples, _, _ = batch_to_samples(make_groups(args.seqs, 4, args.seed), cfg)
    totals = batch_totals(samples)
    lengths = [len(s.tokens) for s in samples]
    longest = max(lengths)
    plan = plan_microbatches(lengths, args.budget, bucket=(mode == "bucketed"))
    pad_to = longest if mode == "naive" else None
    padded = sum(len(mb) * (pad_to or max(lengths[i] for i in mb)) for mb in plan)
    losses, times, cpu_times = [], [], []
    for _ in range(args.steps):
        start, cpu_start, loss_sum = time.perf_counter(), time.process_time(), 0.0
        for idx in plan:
            mb = collate([samples[i] for i in idx], pad_to=pad_to)
            logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
            logp, entropy = token_logprobs(logits[:, :-1], mb.targets, mb.temperature)
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
    parser.add_argument("--seqs", type=int, default=16, help="sequences per step (groups of 4)")
    parser.add_argument("--budget", type=int, default=1024, help="padded tokens per micro-batch")
    parser.add_argument(
        "--steps", type=int, default=1, help="steps per mode (2+: first is warm-up)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=["bucketed", "naive"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args)))
        return
    results = {}
    for mode in ("naive", "bucketed"):
        argv = [sys.executable, __file__, *sys.argv[1:], "--mode", mode]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        results[mode] = json.loads(out.strip().splitlines()[-1])
    head = f"{'mode':<10}{'micro-batches':>14}{'tokens':>8}{'padded':>8}{'step s':>8}"
    print(head + f"{'tokens/s':>10}{'CPU s':>8}{'tokens/CPU s':>14}{'peak RSS GB':>13}  loss")
    for r in results.values():
        print(
            f"{r['mode']:<10}{r['micro_batches']:>14}{r['tokens']:>8}{r['padded_tokens']:>8}"
            f"{r['step_s']:>8.2f}{r['tokens_per_s']:>10.1f}{r['cpu_s']:>8.1f}"
            f"{r['tokens_per_cpu_s']:>14.1f}{r['peak_rss_gb']:>13.2f}  {r['losses'][0]:.8f}"
        )
    b, n = results["bucketed"], results["naive"]
    print(
        f"speed-up bucketed / naive: {b['tokens_per_s'] / n['tokens_per_s']:.2f}x tokens/s "
        f"(wall), {b['tokens_per_cpu_s'] / n['tokens_per_cpu_s']:.2f}x tokens per CPU second; "
        f"peak RSS {b['peak_rss_gb'] / n['peak_rss_gb']:.2f}x; "
        f"first-step loss |diff| {abs(b['losses'][0] - n['losses'][0]):.1e}"
    )


if __name__ == "__main__":
    main()
