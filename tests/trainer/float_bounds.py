"""Tolerances of the trainer's float comparisons, derived from how fp32 rounding propagates.

Two computations that are equal in exact arithmetic (a packed row vs each sequence alone,
micro-batches of another size, padding vs packing) differ in fp32 only by rounding: the same
products summed in another order or by another kernel. The tests bound that difference from the
computation's shape instead of a constant tuned on one CPU (a fixed ``atol=1e-4`` failed on an
AVX-512 Xeon whose kernels block the sums differently).

The model: a sum of K products rounds with a relative error of about ``u * sqrt(K)`` of the
magnitudes involved (rounding errors are independent and add like a random walk; the worst
case ``K * u`` is never approached by blocked BLAS sums), and the errors of ``depth`` chained
layers add. ``u = 2**-24`` is fp32's unit roundoff (half its epsilon). Each test also shows that
a real fault (a leaking attention mask, a lost micro-batch) is orders of magnitude above the
bound, so the bound keeps the test sharp.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

FP32_UNIT_ROUNDOFF = 2.0**-24


def rounding_bound(scale: float, reduction: int, depth: int) -> float:
    """fp32 rounding error of values of magnitude ``scale`` computed through ``depth`` chained
    layers whose sums run over at most ``reduction`` terms.

    >>> f"{rounding_bound(scale=30.0, reduction=1536, depth=30):.1e}"  # SmolLM2-135M's logits
    '2.1e-03'
    """
    return FP32_UNIT_ROUNDOFF * math.sqrt(reduction) * depth * scale


def adamw_first_step_tolerance(
    before: torch.Tensor, after: torch.Tensor, lr: float, grad_error: float, eps: float = 1e-8
) -> torch.Tensor:
    """Per weight: how far two first AdamW steps (no weight decay) may land apart when their
    gradients differ by at most ``grad_error``.

    The first step moves a weight by ``lr * g / (|g| + eps)`` (bias correction cancels the
    betas), so a gradient change ``dg`` moves it by ``lr * eps / (|g| + eps)**2 * dg``: nothing
    for large ``|g|``, up to ``lr / eps * dg`` where ``g`` is ~0 (there the update is
    ill-conditioned and the bound says so). ``|g|`` is read back from the step itself,
    ``|g| = eps * |d| / (lr - |d|)``. Added: each run rounds ``w + d`` to fp32 (half an ulp,
    and one ulp of ``w`` is at most ``2u|w|``), so two runs whose exact results straddle a
    rounding boundary land one ulp apart; two ulps (``4u|w|``) are allowed, plus the rounding
    of the update itself (AdamW rounds ~8 times on the way to it: ``8u * lr`` per run).
    """
    step = (after.double() - before.double()).abs()
    grad = eps * step / (lr - step).clamp_min(lr * 1e-9)
    sensitivity = lr * eps / (grad + eps) ** 2
    own_rounding = 4 * FP32_UNIT_ROUNDOFF * after.double().abs() + 16 * FP32_UNIT_ROUNDOFF * lr
    return sensitivity * grad_error + own_rounding


def gradient_error(row: dict[str, float], model: Path, max_grad_norm: float = 1.0) -> float:
    """Rounding bound on one gradient entry of the step logged as ``row``: entries are at most
    the (clipped) gradient norm; a weight's gradient sums over the batch's tokens, through the
    forward and backward of every layer (depth ``2 * (layers + 1)``)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model))
    tokens = int(row["train/computed_tokens"])
    grad_norm = row["train/grad_norm"]
    reduction = max(tokens, config.intermediate_size, config.vocab_size)
    depth = 2 * (config.num_hidden_layers + 1)
    return rounding_bound(min(grad_norm, max_grad_norm), reduction, depth)


def assert_same_first_adamw_step(
    start: dict[str, torch.Tensor],
    first: dict[str, torch.Tensor],
    second: dict[str, torch.Tensor],
    lr: float,
    grad_error: float,
) -> float:
    """Both state dicts are one AdamW step from ``start`` on gradients equal up to
    ``grad_error``; returns the largest difference as a share of its bound."""
    worst = 0.0
    for key, weights in first.items():
        bound = adamw_first_step_tolerance(start[key], weights, lr, grad_error)
        share = float(((weights.double() - second[key].double()).abs() / bound).max())
        assert share <= 1.0, f"{key}: {share:.2f} x its rounding bound"
        worst = max(worst, share)
    return worst
