"""The GRPO loss as pure functions on tensors; every variant is a LossConfig switch.

Shapes: G sequences in a group; B sequences and T next-token positions in a micro-batch;
V vocabulary. ``mask`` is 1.0 where a position is trained, 0.0 elsewhere. Per-token losses are
summed and divided by a normaliser computed over the *whole* batch (``BatchTotals``), so the
result does not depend on how the batch is cut into micro-batches or shared between ranks.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from atroposlib.utils.advantages import AdvantageBaseline, AdvantageScale, grouped_advantages
from example_trainer.config import LossConfig

# ---------------------------------------------------------------------------------------
# Advantages (per sequence, from scores)
# ---------------------------------------------------------------------------------------


def group_advantages(
    groups: Sequence[Tensor], baseline: str, std: str, eps: float = 1e-4
) -> list[Tensor]:
    """Scores of each group (G_k,) -> advantages (G_k,).

    std="group": divide by the group's (unbiased) score std (GRPO); "batch": by the std of
    every score in the batch; "none": leave unscaled (Dr GRPO). The formula is
    ``atroposlib.utils.advantages.grouped_advantages``, the one environments use too.
    """
    values = grouped_advantages(
        [s.tolist() for s in groups],
        cast(AdvantageBaseline, baseline),
        cast(AdvantageScale, std),
        eps,
    )
    return [s.new_tensor(v) for s, v in zip(groups, values, strict=True)]


def role_advantages(
    scores: Sequence[float],
    roles: Sequence[Hashable],
    baselines: dict[Hashable, float],
    decay: float,
) -> tuple[list[float], dict[Hashable, float]]:
    """SPIRAL role-conditioned advantages: A = r - b_role after b_role <- d*b + (1-d)*r.

    Baselines start at 0 and are updated in order; returns the advantages and new baselines.
    """
    new = dict(baselines)
    advantages = []
    for score, role in zip(scores, roles, strict=True):
        new[role] = decay * new.get(role, 0.0) + (1.0 - decay) * score
        advantages.append(score - new[role])
    return advantages, new


# ---------------------------------------------------------------------------------------
# Per-token quantities
# ---------------------------------------------------------------------------------------


def token_logprobs(
    logits: Tensor, targets: Tensor, temperature: Tensor, entropy_grad: bool = False
) -> tuple[Tensor, Tensor]:
    """logits (B, T, V), targets (B, T), temperature (B,) -> logprobs (B, T), entropy (B, T).

    The entropy carries a gradient only with ``entropy_grad`` (an entropy bonus), so the
    (B, T, V) tensors behind it are not kept for backward when it is only logged.
    """
    logp_all = F.log_softmax(logits.float() / temperature[:, None, None], dim=-1)  # (B, T, V)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, T)
    return logp, entropy


def ppo_clip_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """Token PPO clip, separate bounds (DAPO clip-higher). -> loss (B, T), clipped (B, T)."""
    ratio = torch.exp(logp - old_logp)  # (B, T)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def gspo_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """GSPO sequence ratio exp(mean_t (logp - old_logp)) over trained tokens -> (B,)."""
    lengths = mask.sum(-1).clamp(min=1.0)  # (B,)
    return torch.exp(((logp - old_logp) * mask).sum(-1) / lengths)


def gspo_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, eps_low: float, eps_high: float
) -> tuple[Tensor, Tensor]:
    """GSPO: the sequence ratio, clipped, on every token of the sequence. -> (B, T), (B, T)."""
    ratio = gspo_ratio(logp, old_logp, mask)[:, None].expand_as(logp)  # (B, T)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def importance_weights(
    trainer_logp: Tensor, inference_logp: Tensor, cfg: LossConfig
) -> tuple[Tensor, Tensor]:
    """Off-policy correction (no gradient). -> weight (B, T), keep (B, T) in {0, 1}.

    tis: w = min(pi_trainer / pi_inference, is_cap) multiplies the loss; mask: tokens with w
    outside [is_mask_low, is_mask_high] are dropped; none: weight 1, keep all.
    """
    w = torch.exp(trainer_logp.detach() - inference_logp)  # (B, T)
    ones = torch.ones_like(w)
    if cfg.is_correction == "tis":
        return w.clamp(max=cfg.is_cap), ones
    if cfg.is_correction == "mask":
        keep = ((w >= cfg.is_mask_low) & (w <= cfg.is_mask_high)).to(w.dtype)
        return ones, keep
    return ones, ones


def kl_penalty(logp: Tensor, ref_logp: Tensor, estimator: str) -> Tensor:
    """Per-token KL(pi || ref) estimate on samples of pi. (B, T) -> (B, T)."""
    log_ratio = ref_logp - logp
    if estimator == "k1":
        return -log_ratio
    return torch.exp(log_ratio) - log_ratio - 1.0


def mismatch_kl(trainer_logp: Tensor, inference_logp: Tensor) -> Tensor:
    """k3 estimate of KL(pi_inference || pi_trainer) on inference samples. (B, T) -> (B, T)."""
    log_ratio = trainer_logp.detach() - inference_logp
    return torch.exp(log_ratio) - log_ratio - 1.0


def distill_reverse_kl(student_logp: Tensor, teacher_logp: Tensor, valid: Tensor) -> Tensor:
    """Per-token reverse KL(student || teacher) on the teacher's top-k ids plus one "rest"
    bucket (every other token). -> (B, T)

    student_logp, teacher_logp (B, T, K): full-vocabulary logprobs of the K ids (the sampled
    token first); valid (B, T, K) bool. The K + 1 buckets are a coarsening of both full
    distributions, so the value is a lower bound of the full KL that is 0 only when they
    agree on every known id and on the mass left over (K = 1 still compares the sampled
    token against the rest).
    """
    s = student_logp.masked_fill(~valid, float("-inf"))  # (B, T, K)
    t = teacher_logp.masked_fill(~valid, float("-inf"))
    s_rest = torch.log1p(-s.exp().sum(-1).clamp(max=1.0 - 1e-6))  # (B, T)
    t_rest = torch.log1p(-t.exp().sum(-1).clamp(max=1.0 - 1e-6))
    known = (s.exp() * (s - t)).masked_fill(~valid, 0.0).sum(-1)  # (B, T)
    return known + s_rest.exp() * (s_rest - t_rest)


# ---------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchTotals:
    """Normalisers over the whole batch (every micro-batch, every rank)."""

    tokens: int  # trained tokens
    sequences: int  # sequences with at least one trained token


def aggregate(
    token_loss: Tensor, mask: Tensor, mode: str, totals: BatchTotals, constant: int
) -> Tensor:
    """(B, T) per-token loss -> this micro-batch's share of the batch loss (scalar)."""
    if mode == "token_mean":
        return (token_loss * mask).sum() / max(totals.tokens, 1)
    if mode == "seq_mean_token_mean":
        per_seq = (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
        return per_seq.sum() / max(totals.sequences, 1)
    return (token_loss * mask).sum() / (max(totals.sequences, 1) * constant)


# ---------------------------------------------------------------------------------------
# The whole loss of one micro-batch
# ---------------------------------------------------------------------------------------


@dataclass
class LossInputs:
    """One micro-batch, next-token aligned: position t predicts targets[:, t]."""

    logp: Tensor  # (B, T) trainer logprobs of the targets, with gradient
    entropy: Tensor  # (B, T)
    mask: Tensor  # (B, T) float, 1 where trained (weight-0 sequences already zeroed)
    advantages: Tensor  # (B, T)
    sft: Tensor  # (B,) bool: plain NLL rows
    inference_logp: Tensor | None = None  # (B, T); rows without them hold trainer values
    has_inference: Tensor | None = None  # (B,) bool: row came with inference logprobs
    ref_logp: Tensor | None = None  # (B, T)
    distill_student: Tensor | None = None  # (B, T, K) student logprobs of the teacher's ids
    distill_teacher: Tensor | None = None  # (B, T, K) the teacher's logprobs of them
    distill_valid: Tensor | None = None  # (B, T, K) bool


def grpo_loss(
    x: LossInputs, cfg: LossConfig, totals: BatchTotals, constant: int
) -> tuple[Tensor, dict[str, Tensor]]:
    """-> (scalar loss share, metric sums over trained tokens; divide by their 'tokens')."""
    rl = (~x.sft)[:, None].to(x.mask.dtype) * x.mask  # (B, T)
    sft = x.sft[:, None].to(x.mask.dtype) * x.mask  # (B, T)
    trainer_old = x.logp.detach()
    inference = trainer_old
    if x.inference_logp is not None:
        rows = x.has_inference if x.has_inference is not None else torch.ones_like(x.sft)
        inference = torch.where(rows[:, None], x.inference_logp, trainer_old)
    old = inference if cfg.behavior_logprobs == "inference" else trainer_old

    weight, keep = importance_weights(x.logp, inference, cfg)  # (B, T), (B, T)
    rl = rl * keep
    if cfg.ratio == "sequence":
        pg, clipped = gspo_loss(x.logp, old, x.advantages, rl, cfg.clip_eps_low, cfg.clip_eps_high)
    else:
        pg, clipped = ppo_clip_loss(x.logp, old, x.advantages, cfg.clip_eps_low, cfg.clip_eps_high)
    token_loss = pg * weight  # (B, T)
    kl = torch.zeros_like(x.logp)
    if x.ref_logp is not None:
        kl = kl_penalty(x.logp, x.ref_logp, cfg.kl_estimator)
        if cfg.kl_coef > 0:
            token_loss = token_loss + cfg.kl_coef * kl
    if cfg.entropy_coef > 0:
        token_loss = token_loss - cfg.entropy_coef * x.entropy
    token_loss = token_loss * rl - x.logp * sft  # SFT rows: plain NLL
    loss = aggregate(token_loss, rl + sft, cfg.aggregation, totals, constant)
    distill = torch.zeros_like(x.logp)
    student, teacher, valid = x.distill_student, x.distill_teacher, x.distill_valid
    if cfg.distill_coef > 0 and student is not None and teacher is not None and valid is not None:
        distill = distill_reverse_kl(student, teacher, valid)
        distill = distill * valid[..., 0]  # positions the teacher scored
        share = aggregate(distill, x.mask, "token_mean", totals, constant)
        loss = cfg.distill_coef * share + (0.0 if cfg.distill_only else loss)

    with torch.no_grad():
        m = x.mask
        has_inf = x.has_inference if x.has_inference is not None else torch.zeros_like(x.sft)
        inf_rows = rl * has_inf[:, None].to(m.dtype)
        metrics = {
            "tokens": m.sum(),
            "rl_tokens": rl.sum(),
            "clip_frac": (clipped.to(m.dtype) * rl).sum(),
            "entropy": (x.entropy.detach() * m).sum(),
            "mismatch_kl": (mismatch_kl(x.logp, inference) * inf_rows).sum(),
            "mismatch_tokens": inf_rows.sum(),
            "is_weight": (weight * rl).sum(),
            "is_masked": ((1.0 - keep) * (~x.sft)[:, None].to(m.dtype) * x.mask).sum(),
            "ref_kl": (kl.detach() * rl).sum(),
            "sft_nll": (-x.logp.detach() * sft).sum(),
            "sft_tokens": sft.sum(),
            "distill_kl": (distill.detach() * x.mask).sum(),
        }
    return loss, metrics
