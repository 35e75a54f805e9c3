"""One step's metrics: per-token means of the loss terms, throughput, and what the batch held."""

from __future__ import annotations

from typing import Any

import numpy as np

from example_trainer.sequence_packing import MicroBatchPlan


def loss_metrics(total: dict[str, float]) -> dict[str, float]:
    """Per-token means of the loss terms summed over the batch."""

    def mean(key: str, per: str) -> float:
        return total[key] / max(total[per], 1.0)

    return {
        "train/loss": total["loss"],
        "train/entropy": mean("entropy", "tokens"),
        "train/clip_frac": mean("clip_frac", "rl_tokens"),
        "train/mismatch_kl": mean("mismatch_kl", "mismatch_tokens"),
        "train/is_weight": mean("is_weight", "rl_tokens"),
        "train/is_masked_frac": mean("is_masked", "tokens"),
        "train/ref_kl": mean("ref_kl", "rl_tokens"),
        "train/sft_nll": mean("sft_nll", "sft_tokens"),
        "train/distill_kl": mean("distill_kl", "tokens"),
        "train/trained_tokens": total["tokens"],
    }


def throughput_metrics(
    lengths: list[int], plan: MicroBatchPlan, elapsed: float
) -> dict[str, float]:
    seq_tokens = sum(lengths)
    return {
        "train/computed_tokens": float(seq_tokens),  # the sequences' tokens (all ranks)
        "train/forward_tokens": float(sum(plan.costs)),  # positions the forward computed
        "train/tokens_per_s": seq_tokens / elapsed,
        "train/padding_frac": 1.0 - plan.tokens / max(1, sum(plan.costs)),
    }


def data_metrics(stats: Any, lags: np.ndarray, step: int) -> dict[str, float]:
    """What the batch held: dropped groups, staleness, version lags, advantages, rewards."""
    staleness = [step - 1 - v for v in stats.policy_versions]
    return {
        "train/zero_variance_groups": float(stats.zero_variance_groups),
        "train/truncated_masked": float(stats.truncated_masked),
        "train/invalid_groups": float(stats.invalid_groups),
        "train/staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
        "train/staleness_max": float(max(staleness)) if staleness else 0.0,
        "train/version_lag_min": float(lags.min()) if lags.size else 0.0,
        "train/version_lag_mean": float(lags.mean()) if lags.size else 0.0,
        "train/version_lag_max": float(lags.max()) if lags.size else 0.0,
        **{f"train/advantage_{k}": float(v) for k, v in stats.advantage.items()},
        **{f"env/{env}/reward_mean": r for env, r in stats.rewards_by_env.items()},
    }
