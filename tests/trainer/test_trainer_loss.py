"""Each loss option against a hand-computed example on tiny tensors."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from example_trainer.config import LossConfig
from example_trainer.loss import (
    BatchTotals,
    LossInputs,
    aggregate,
    group_advantages,
    grpo_loss,
    gspo_loss,
    gspo_ratio,
    importance_weights,
    kl_penalty,
    mismatch_kl,
    ppo_clip_loss,
    role_advantages,
    token_logprobs,
)

T = torch.tensor


def close(a: torch.Tensor, b: list[float] | float, tol: float = 1e-5) -> bool:
    return torch.allclose(a.double(), torch.as_tensor(b, dtype=torch.float64), atol=tol)


# ---- advantages -----------------------------------------------------------------------


def test_group_mean_and_leave_one_out_baselines() -> None:
    scores = T([1.0, 2.0, 3.0, 6.0])
    (mean,) = group_advantages([scores], "group_mean", "none")
    assert close(scores - mean, [3.0] * 4)  # the baseline subtracted: the group mean
    (loo,) = group_advantages([scores], "leave_one_out", "none")
    # RLOO: mean of the other three scores
    assert close(scores - loo, [11 / 3, 10 / 3, 3.0, 2.0])
    assert close(loo, [-8 / 3, -4 / 3, 0.0, 4.0])  # = G/(G-1) * (r - mean)


def test_grpo_divides_by_group_std() -> None:
    scores = T([1.0, 2.0, 3.0, 6.0])
    (adv,) = group_advantages([scores], "group_mean", "group", eps=0.0)
    std = statistics.stdev([1, 2, 3, 6])  # sqrt(14/3), unbiased
    assert close(adv, [-2 / std, -1 / std, 0.0, 3 / std])


def test_dr_grpo_keeps_reward_scale_where_grpo_equalises_groups() -> None:
    easy, hard = T([0.0, 1.0]), T([0.0, 0.1])  # same ordering, 10x smaller reward gap
    grpo = group_advantages([easy, hard], "group_mean", "group", eps=0.0)
    dr = group_advantages([easy, hard], "group_mean", "none")
    # GRPO: std normalisation makes both groups weigh the same (the bias Dr GRPO removes)
    assert close(grpo[0], grpo[1].tolist())
    assert close(grpo[0], [-1 / math.sqrt(2), 1 / math.sqrt(2)])
    # Dr GRPO: plain r - mean, so the low-variance group gets 10x smaller advantages
    assert close(dr[0], [-0.5, 0.5]) and close(dr[1], [-0.05, 0.05])


def test_batch_std_scaling_uses_every_score() -> None:
    a, b = T([0.0, 1.0]), T([0.0, 0.1])
    out = group_advantages([a, b], "group_mean", "batch", eps=0.0)
    std = statistics.stdev([0.0, 1.0, 0.0, 0.1])
    assert close(out[0], [-0.5 / std, 0.5 / std]) and close(out[1], [-0.05 / std, 0.05 / std])


def test_single_sequence_group_has_zero_advantage() -> None:
    (adv,) = group_advantages([T([0.7])], "leave_one_out", "group")
    assert close(adv, [0.0])


def test_spiral_role_baselines_are_running_means_per_role() -> None:
    adv, new = role_advantages([1.0, 0.0, 1.0], ["A", "B", "A"], {}, decay=0.5)
    # A: b = 0.5*0 + 0.5*1 = 0.5 -> 0.5; B: b = 0 -> 0; A: b = 0.5*0.5 + 0.5*1 = 0.75 -> 0.25
    assert adv == pytest.approx([0.5, 0.0, 0.25])
    assert new == pytest.approx({"A": 0.75, "B": 0.0})
    adv2, _ = role_advantages([1.0], ["A"], new, decay=0.5)  # baselines carry over
    assert adv2 == pytest.approx([1.0 - 0.875])


# ---- ratio and clipping -----------------------------------------------------------------


def test_ppo_clip_with_separate_low_and_high_epsilon() -> None:
    ratios = T([[0.5, 1.25, 1.5], [0.5, 1.25, 1.5]])
    adv = T([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    logp = torch.log(ratios)
    loss, clipped = ppo_clip_loss(logp, torch.zeros_like(logp), adv, eps_low=0.2, eps_high=0.28)
    # A>0: min(r, clip(r)) -> 0.5 (no clip below for A>0), 1.25 (under 1.28), 1.28 (clipped)
    # A<0: max(r, clip(r)) -> 0.8 (clipped at 1-0.2), 1.25, 1.5
    assert close(loss, [[-0.5, -1.25, -1.28], [0.8, 1.25, 1.5]])
    assert clipped.tolist() == [[False, False, True], [True, False, False]]
    symmetric, _ = ppo_clip_loss(logp, torch.zeros_like(logp), adv, 0.2, 0.2)
    assert close(symmetric[0, 1], -1.2)  # plain PPO clips 1.25 to 1.2; clip-higher does not


def test_clipped_tokens_get_no_gradient() -> None:
    logp = torch.log(T([[1.5, 1.1]])).requires_grad_()
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 2), T([[1.0, 1.0]]), 0.2, 0.2)
    loss.sum().backward()
    assert logp.grad is not None and close(logp.grad, [[0.0, -1.1]])


def test_gspo_ratio_is_length_normalised_sequence_ratio() -> None:
    logp = T([[-1.0, -2.0, -9.0], [-1.0, -1.0, -1.0]])
    old = T([[-1.1, -2.3, -1.0], [-1.0, -1.5, -2.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    ratio = gspo_ratio(logp, old, mask)
    # (pi/pi_old of the sequence)^(1/|y|): geometric mean of the token ratios
    assert close(ratio, [math.exp((0.1 + 0.3) / 2), math.exp((0.0 + 0.5 + 1.0) / 3)])
    loss, clipped = gspo_loss(logp, old, T([[1.0] * 3, [-1.0] * 3]), mask, 3e-4, 4e-4)
    assert close(loss[0], [-1.0004] * 3) and close(loss[1], [ratio[1].item()] * 3)
    assert clipped[0].all() and not clipped[1].any()


# ---- off-policy correction, KL, entropy -------------------------------------------------


def test_truncated_importance_sampling_caps_weights() -> None:
    trainer = torch.log(T([[0.5, 1.5, 3.0]]))
    w, keep = importance_weights(
        trainer, torch.zeros(1, 3), LossConfig(is_correction="tis", is_cap=2.0)
    )
    assert close(w, [[0.5, 1.5, 2.0]]) and close(keep, [[1.0, 1.0, 1.0]])


def test_is_mask_drops_tokens_outside_bounds() -> None:
    trainer = torch.log(T([[0.4, 1.0, 2.5, 0.5]]))
    cfg = LossConfig(is_correction="mask", is_mask_low=0.5, is_mask_high=2.0)
    w, keep = importance_weights(trainer, torch.zeros(1, 4), cfg)
    assert close(w, [[1.0] * 4]) and close(keep, [[0.0, 1.0, 0.0, 1.0]])


def test_kl_estimators() -> None:
    logp, ref = torch.log(T([0.5])), torch.log(T([0.25]))
    assert close(kl_penalty(logp, ref, "k1"), [math.log(2)])
    assert close(kl_penalty(logp, ref, "k3"), [0.5 + math.log(0.5) * -1 - 1])  # r - log r - 1
    assert close(kl_penalty(ref, ref, "k3"), [0.0])


def test_mismatch_kl_is_zero_on_agreement_and_positive_otherwise() -> None:
    a = T([[-1.0, -2.0]])
    assert close(mismatch_kl(a, a), [[0.0, 0.0]])
    assert close(mismatch_kl(a, a - 0.5), [[math.exp(0.5) - 0.5 - 1] * 2])


def test_token_logprobs_with_temperature_and_entropy() -> None:
    logits = T([[[2.0, 0.0]]])
    logp, ent = token_logprobs(logits, T([[0]]), T([2.0]))
    p = math.exp(1) / (math.exp(1) + 1)  # softmax([1, 0])
    assert close(logp, [[math.log(p)]])
    assert close(ent, [[-(p * math.log(p) + (1 - p) * math.log(1 - p))]])


# ---- aggregation --------------------------------------------------------------------------


TOKEN_LOSS = T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
TOTALS = BatchTotals(tokens=4, sequences=2)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token_mean", 10 / 4),  # DAPO: every token of the batch weighs the same
        ("seq_mean_token_mean", (6 / 3 + 4 / 1) / 2),  # GRPO: mean over sequences of token means
        ("constant", 10 / (2 * 5)),  # Dr GRPO: sum / (sequences * constant)
    ],
)
def test_aggregation_modes(mode: str, expected: float) -> None:
    assert close(aggregate(TOKEN_LOSS, MASK, mode, TOTALS, constant=5), expected)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "constant"])
def test_aggregation_does_not_depend_on_micro_batch_split(mode: str) -> None:
    whole = aggregate(TOKEN_LOSS, MASK, mode, TOTALS, 5)
    parts = sum(
        aggregate(TOKEN_LOSS[i : i + 1], MASK[i : i + 1], mode, TOTALS, 5) for i in range(2)
    )
    assert close(whole, float(parts))


# ---- the assembled loss ---------------------------------------------------------------------


def _inputs(**kw: torch.Tensor) -> LossInputs:
    base = {
        "logp": T([[-1.0, -2.0]]),
        "entropy": T([[0.5, 0.7]]),
        "mask": T([[1.0, 1.0]]),
        "advantages": T([[1.0, 1.0]]),
        "sft": T([False]),
    }
    base.update(kw)
    return LossInputs(**base)  # type: ignore[arg-type]


def test_sft_rows_are_plain_nll() -> None:
    loss, m = grpo_loss(_inputs(sft=T([True])), LossConfig(), BatchTotals(2, 1), 10)
    assert close(loss, 1.5) and close(m["sft_nll"], 3.0) and close(m["rl_tokens"], 0.0)


def test_on_policy_loss_is_minus_mean_advantage_plus_penalties() -> None:
    cfg = LossConfig(kl_coef=0.1, kl_estimator="k1", entropy_coef=0.01)
    x = _inputs(advantages=T([[2.0, -1.0]]), ref_logp=T([[-1.5, -2.0]]))
    loss, m = grpo_loss(x, cfg, BatchTotals(2, 1), 10)
    # ratio 1: pg = -A; k1 = logp - ref = [0.5, 0]; entropy bonus -0.01 * [0.5, 0.7]
    expected = ((-2.0 + 0.1 * 0.5 - 0.005) + (1.0 + 0.0 - 0.007)) / 2
    assert close(loss, expected) and close(m["ref_kl"], 0.5)


def test_behavior_inference_uses_inference_logprobs_as_old_policy() -> None:
    x = _inputs(inference_logp=T([[-1.0 - math.log(1.5), -2.0]]), has_inference=T([True]))
    loss, m = grpo_loss(x, LossConfig(behavior_logprobs="inference"), BatchTotals(2, 1), 10)
    assert close(loss, (-1.2 - 1.0) / 2)  # first token ratio 1.5 clipped to 1.2
    assert close(m["clip_frac"], 1.0)
    trainer_old, _ = grpo_loss(x, LossConfig(), BatchTotals(2, 1), 10)
    assert close(trainer_old, -1.0)


def test_tis_weights_multiply_the_policy_loss() -> None:
    x = _inputs(inference_logp=T([[-1.0 - math.log(3.0), -2.0]]), has_inference=T([True]))
    loss, m = grpo_loss(x, LossConfig(is_correction="tis", is_cap=2.0), BatchTotals(2, 1), 10)
    assert close(loss, (-2.0 - 1.0) / 2) and close(m["is_weight"], 3.0)
    assert m["mismatch_kl"].item() > 0
