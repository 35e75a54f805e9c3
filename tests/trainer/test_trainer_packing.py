"""Sequence packing: block-diagonal attention, the plan, and the same loss as padded rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from float_bounds import rounding_bound
from trainer_helpers import MIXED_LOSSES, make_group

from example_trainer.config import LossConfig
from example_trainer.data import (
    MicroBatch,
    Sample,
    batch_to_samples,
    batch_totals,
    collate,
    padded_tokens,
    plan_microbatches,
    shard_plan,
)
from example_trainer.loss import BatchTotals, LossInputs, grpo_loss
from example_trainer.sequence_packing import (
    collate_packed,
    model_logprobs,
    packed_costs,
    plan_packed,
    row_length,
)


def load(path: Path, attn: str = "sdpa") -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.config._attn_implementation = attn
    return model


# ---- the attention mask transformers builds from restarting position_ids ---------------


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_each_sequence_alone(test_model_path: Path, attn: str) -> None:
    """Packed and alone are both fp32 roundings of one exact result: each is checked against a
    float64 forward of the sequence alone, within ``rounding_bound`` (fp32 unit roundoff x
    sqrt(longest sum: the MLP's 1536) x 30 layers x the logits' magnitude, ~2e-3 here). A mask
    that let sequences see each other would be off by > 1 (the last assertion)."""
    model = load(test_model_path, attn).eval()
    reference = load(test_model_path, attn).double().eval()
    config = model.config
    rng = np.random.default_rng(0)
    seqs = [torch.as_tensor(rng.integers(100, 40000, size=n)) for n in (9, 33, 1, 2, 17)]
    ids = torch.cat(seqs)[None]
    positions = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        start = 0
        for seq in seqs:
            exact = reference(input_ids=seq[None], use_cache=False).logits[0]
            bound = rounding_bound(
                scale=exact.abs().max().item(),
                reduction=max(config.hidden_size, config.intermediate_size),
                depth=config.num_hidden_layers,
            )
            alone = model(input_ids=seq[None], use_cache=False).logits[0]
            row = packed[start : start + len(seq)]
            for fp32 in (row, alone):
                torch.testing.assert_close(fp32.double(), exact, atol=bound, rtol=0)
            start += len(seq)
        # the same row read as ONE sequence differs: the mask really is block-diagonal
        whole = model(input_ids=ids, use_cache=False).logits[0]
    assert (whole[9:42] - packed[9:42]).abs().max() > 1.0 > 100 * bound


# ---- the plan ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_packed_plan_covers_every_sequence_once_within_budget(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = [int(x) for x in np.clip(rng.lognormal(4.0, 1.0, size=60), 1, 900)]
    row_tokens, budget = 512, 1536
    plan = plan_packed(lengths, row_tokens, budget)
    rows = [row for mb in plan for row in mb]
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    for row in rows:
        assert sum(lengths[i] for i in row) <= row_tokens or len(row) == 1
    costs = packed_costs(plan, lengths)
    assert all(c <= budget or len(mb) == 1 for mb, c in zip(plan, costs, strict=True))
    # rows come out nearly full: within 22% (+1) of the volume floor, padding < 10%
    volume = sum(min(n, row_tokens) for n in lengths) / row_tokens
    assert len(rows) <= 11 / 9 * np.ceil(volume) + 1 + sum(n > row_tokens for n in lengths)
    assert sum(costs) < 1.1 * sum(lengths)
    assert sum(costs) < padded_tokens(plan_microbatches(lengths, budget), lengths)


def test_a_sequence_longer_than_the_row_gets_a_row_of_its_own() -> None:
    # first fit decreasing: 60 + 40 fill a row; one row per micro-batch by default
    assert plan_packed([300, 60, 50, 40], row_tokens=100) == [[[0]], [[1, 3]], [[2]]]
    # rows x longest row <= 200: the 100-token row and the 50-token row share one
    assert plan_packed([300, 60, 50, 40], 100, 200) == [[[0]], [[1, 3], [2]]]


def test_default_row_length_fits_the_longest_sequence_in_a_power_of_two() -> None:
    assert row_length([391, 20, 100], cap=1024) == 512
    assert row_length([512, 3], cap=1024) == 512 and row_length([513], cap=4096) == 1024
    assert row_length([391], cap=256) == 256  # capped by max_token_len / micro_batch_tokens
    assert row_length([1], cap=64) == 1


def test_packed_shards_balance_by_row_tokens() -> None:
    lengths = [90, 80, 70, 60, 50, 40, 30, 20, 10, 5]
    plan = plan_packed(lengths, 100)
    costs = packed_costs(plan, lengths)
    shards = [shard_plan(plan, costs, 2, r) for r in range(2)]
    assert sorted(str(mb) for s in shards for mb in s) == sorted(map(str, plan))
    loads = [sum(lengths[i] for mb in s for row in mb for i in row) for s in shards]
    assert abs(loads[0] - loads[1]) <= max(lengths)


# ---- the packed row and its gather --------------------------------------------------------


def mixed_samples(cfg: LossConfig, seed: int = 0) -> list[Sample]:
    """Mixed lengths, an SFT group, rows with and without inference logprobs, temperatures."""
    rng = np.random.default_rng(seed)
    rl = make_group(
        rng,
        [0.0, 1.0, 1.0, 0.0],
        prompt_len=5,
        completion_lens=[3, 21, 9, 40],
        overrides=[{"temperature": 0.7}, {}, {"temperature": 1.3}, {}],
        generation_params={"temperature": 0.9},
    )
    rl["inference_logprobs"][1] = None  # a row the sampler sent no logprobs for
    short = make_group(rng, [1.0, 0.0, 0.5], prompt_len=12, completion_lens=[2, 30, 6])
    sft = make_group(rng, [1.0, 1.0], prompt_len=3, completion_lens=[14, 4])
    sft["group_overrides"] = {"sft": True}
    groups = [rl, short, sft]
    for group in groups:  # reference logprobs for the KL, on every row
        group["ref_logprobs"] = [-rng.uniform(2.0, 6.0, size=len(t)) for t in group["tokens"]]
    samples, _, _ = batch_to_samples(groups, cfg)
    return samples


@pytest.mark.parametrize("trained_only", [False, True])
def test_boundary_and_padding_positions_are_never_gathered(trained_only: bool) -> None:
    samples = mixed_samples(LossConfig())
    rows = [samples[:4], samples[4:]]  # two rows of different widths: the shorter is padded
    mb = collate_packed(rows, trained_only)
    assert mb.packed is not None
    width = int(mb.packed.input_ids.shape[1])
    starts, last, real = [], set(), set()
    for r, row in enumerate(rows):
        offset = r * width
        for sample in row:
            starts.append(offset)
            real |= set(range(offset, offset + len(sample.tokens)))
            offset += len(sample.tokens)
            last.add(offset - 1)  # predicts the next sequence's first token (or padding)
    assert len(real) < mb.packed.input_ids.numel()  # there is row padding
    index = mb.packed.index
    if mb.packed.scored is None:
        scored = list(range(mb.packed.input_ids.numel()))
    else:
        scored = np.flatnonzero(mb.packed.scored.numpy()).tolist()
    gathered = {scored[k] for k in index.flatten().tolist() if k < len(scored)}
    assert not gathered & last and gathered <= real
    b, t = np.nonzero(mb.mask.numpy())
    trained = {starts[i] + j for i, j in zip(b, t, strict=True)}
    assert trained <= gathered  # every trained position is there
    if trained_only:
        assert gathered == trained
    else:
        assert len(gathered) == sum(len(s.tokens) - 1 for s in samples)
    # each trained position's target is the next token of its own sequence
    assert torch.equal(mb.packed.targets[index[b, t]], mb.targets[b, t])
    assert torch.equal(mb.packed.temperature[index[b, t]], mb.temperature[b])


def test_an_earlier_sequence_in_the_row_does_not_change_the_next_ones_loss(
    tiny_model: Path,
) -> None:
    model = load(tiny_model)
    cfg = LossConfig()
    a, b = mixed_samples(cfg)[1], mixed_samples(cfg)[2]
    b.weight = 0.0  # untrained, first in the row: only attention could carry it into a's loss
    out, plain = [], []
    for seed in (1, 2):
        b.tokens = np.random.default_rng(seed).integers(1, 256, size=len(b.tokens))
        mb = collate_packed([[b, a]], trained_only=False)
        assert mb.packed is not None
        logp, _ = model_logprobs(model, mb)
        out.append((logp * mb.mask).sum())
        with torch.no_grad():  # the same row without restarting positions: one long sequence
            logits = model(input_ids=mb.packed.input_ids, use_cache=False).logits
        plain.append(logits[0, len(b.tokens) :])
    torch.testing.assert_close(out[0], out[1], atol=1e-6, rtol=0)
    assert (plain[0] - plain[1]).abs().max() > 1e-3  # what the block-diagonal mask prevents


# ---- the same loss and gradients in every mode ---------------------------------------------

Plan = Callable[[list[int]], list[Any]]
Build = Callable[[list[Sample], Any], MicroBatch]
BUDGET = 96


def rows_of(samples: list[Sample], entry: list[list[int]], trained_only: bool) -> MicroBatch:
    return collate_packed([[samples[i] for i in row] for row in entry], trained_only)


MODES: dict[str, tuple[Plan, Build]] = {
    "naive": (
        lambda n: plan_microbatches(n, BUDGET, bucket=False),
        lambda s, e: collate([s[i] for i in e], pad_to=64),
    ),
    "bucketed": (
        lambda n: plan_microbatches(n, BUDGET),
        lambda s, e: collate([s[i] for i in e]),
    ),
    "packed": (lambda n: plan_packed(n, BUDGET), lambda s, e: rows_of(s, e, False)),
    "packed_trained_logits": (
        lambda n: plan_packed(n, BUDGET),
        lambda s, e: rows_of(s, e, True),
    ),
    "packed_short_rows": (  # rows of 48, two to a micro-batch: row padding, several rows
        lambda n: plan_packed(n, 48, BUDGET),
        lambda s, e: rows_of(s, e, True),
    ),
}


def one_step(model: Any, samples: list[Sample], mode: str, cfg: LossConfig) -> Any:
    plan_fn, build = MODES[mode]
    model.zero_grad(set_to_none=True)
    totals: BatchTotals = batch_totals(samples)
    plan = plan_fn([len(s.tokens) for s in samples])
    loss_sum, metric_sums = 0.0, {}
    for entry in plan:
        mb = build(samples, entry)
        logp, entropy = model_logprobs(model, mb, cfg.entropy_coef > 0)
        x = LossInputs(
            logp, entropy, mb.mask, mb.advantages, mb.sft,
            mb.inference_logprobs, mb.has_inference, mb.ref_logprobs,
        )  # fmt: skip
        loss, metrics = grpo_loss(x, cfg, totals, 100)
        loss.backward()
        loss_sum += loss.item()
        for k, v in metrics.items():
            metric_sums[k] = metric_sums.get(k, 0.0) + v.item()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return len(plan), loss_sum, metric_sums, grads


@pytest.mark.parametrize("name", MIXED_LOSSES)
def test_every_mode_gives_the_same_loss_and_gradients(tiny_model: Path, name: str) -> None:
    cfg = MIXED_LOSSES[name]
    model = load(tiny_model)
    samples = mixed_samples(cfg)
    assert {s.sft for s in samples} == {True, False}
    assert len({s.temperature for s in samples}) >= 3
    results = {mode: one_step(model, samples, mode, cfg) for mode in MODES}
    n_naive, loss, metrics, grads = results["naive"]
    assert abs(loss) > 1e-3 and metrics["clip_frac"] >= 0
    assert results["packed"][0] < results["bucketed"][0] <= n_naive  # fewer forward passes
    for mode, (_, m_loss, m_metrics, m_grads) in results.items():
        assert m_loss == pytest.approx(loss, abs=1e-5), mode
        for key, value in metrics.items():
            assert m_metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (mode, key)
        for key, grad in grads.items():
            torch.testing.assert_close(m_grads[key], grad, atol=1e-5, rtol=1e-4, msg=mode)
    assert max(g.abs().max().item() for g in grads.values()) > 1e-3  # gradients are real


def test_a_micro_batch_with_no_trained_token_still_reaches_every_parameter(
    tiny_model: Path,
) -> None:
    """DDP's gradient all-reduce needs every parameter in the graph, even with K = 0 logits."""
    model = load(tiny_model)
    sample = mixed_samples(LossConfig())[0]
    sample.weight = 0.0
    mb = collate_packed([[sample]], trained_only=True)
    assert mb.packed is not None and mb.packed.scored is not None
    assert not mb.packed.scored.any()
    logp, _ = model_logprobs(model, mb)
    (logp * mb.mask).sum().backward()
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
