"""Pure tests of next-token selection: nucleus renormalisation, greedy, seeds, top logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from atroposlib.inference.sampling import (
    NEG_INF_FLOOR,
    SamplingParams,
    inverse_cdf,
    nucleus_log_probs,
    sample_next,
)


@pytest.mark.parametrize(
    ("probs", "top_p", "kept"),
    [
        ([0.5, 0.3, 0.2], 1.0, [0.5, 0.3, 0.2]),
        ([0.5, 0.3, 0.2], 0.45, [1.0, 0.0, 0.0]),
        ([0.5, 0.3, 0.2], 0.6, [0.625, 0.375, 0.0]),
        ([0.5, 0.3, 0.2], 0.8, [0.625, 0.375, 0.0]),
        ([0.2, 0.5, 0.3], 0.81, [0.2, 0.5, 0.3]),
        ([0.1, 0.9], 0.05, [0.0, 1.0]),
    ],
)
def test_nucleus_keeps_the_smallest_set_reaching_top_p(
    probs: list[float], top_p: float, kept: list[float]
) -> None:
    log_probs = torch.tensor([probs]).log()
    result = nucleus_log_probs(log_probs, torch.tensor([top_p])).exp()[0]
    assert torch.allclose(result, torch.tensor(kept), atol=1e-6)


def test_greedy_takes_the_argmax_and_reports_the_untempered_logprob() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    out = sample_next(logits, [SamplingParams(temperature=0.0, top_p=0.5)], [None])
    assert out.token_ids == [1]
    assert out.logprobs[0] == pytest.approx(torch.log_softmax(logits, -1)[0, 1].item())


def test_sampled_logprob_uses_the_temperature() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    params = SamplingParams(temperature=0.5, seed=0)
    out = sample_next(logits, [params], [torch.Generator().manual_seed(0)])
    expected = torch.log_softmax(logits / 0.5, -1)[0, out.token_ids[0]].item()
    assert out.logprobs[0] == pytest.approx(expected, abs=1e-6)


def test_rows_with_equal_seeds_draw_the_same_tokens() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    logits[2] = logits[0]
    params = [SamplingParams(temperature=1.0)] * 3
    draws = []
    for _ in range(10):
        gens = [torch.Generator().manual_seed(s) for s in (7, 8, 7)]
        out = sample_next(logits, params, gens)
        draws.append(out.token_ids)
        assert out.token_ids[0] == out.token_ids[2]
    assert len({tuple(d) for d in draws}) == 1


def test_sampling_never_leaves_the_nucleus_and_top_logprobs_are_finite() -> None:
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0, -2.0]])
    params = [SamplingParams(temperature=1.0, top_p=0.9, top_logprobs=4)]
    generator = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(50):
        out = sample_next(logits, params, [generator])
        seen.add(out.token_ids[0])
        top = out.top_logprobs[0]
        assert [t for t, _ in top][:2] == [0, 1]
        assert all(math.isfinite(lp) and lp >= NEG_INF_FLOOR for _, lp in top)
        assert math.exp(top[0][1]) + math.exp(top[1][1]) == pytest.approx(1.0, abs=1e-5)
    assert seen == {0, 1}


def test_top_k_and_min_p_restrict_and_renormalise() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]])
    params = [
        SamplingParams(temperature=1.0, top_k=2, top_logprobs=4),
        SamplingParams(temperature=1.0, min_p=0.3, top_logprobs=4),
    ]
    generator = torch.Generator().manual_seed(0)
    out = sample_next(logits, params, [generator, generator])
    two = torch.log_softmax(logits[0, :2], -1)
    assert out.top_logprobs[0][:2] == [
        (0, pytest.approx(two[0].item())),
        (1, pytest.approx(two[1].item())),
    ]
    assert out.top_logprobs[0][2][1] == NEG_INF_FLOOR
    # p ~ [0.64, 0.24, 0.09, 0.03]: min_p 0.3 keeps tokens with p >= 0.19, i.e. the first two
    assert out.top_logprobs[1][:2] == out.top_logprobs[0][:2]
    assert out.token_ids[0] in (0, 1) and out.token_ids[1] in (0, 1)


@pytest.mark.parametrize("block", [256, 4, 2, 1])
def test_inverse_cdf_draws_each_token_with_its_probability(block: int) -> None:
    """200k draws from a distribution with a zero and a tiny token: each frequency within
    5 standard errors of its probability, and the zero-probability token never drawn
    (blocks of 4, 2 and 1 tokens: the two-level search across several blocks)."""
    probs = torch.tensor([0.1, 0.0, 0.25, 1e-4, 0.4499, 0.2])
    draws = 200_000
    uniforms = torch.rand(draws, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    tokens = inverse_cdf(probs.expand(draws, -1), uniforms, block=block)
    freq = torch.bincount(tokens, minlength=len(probs)).double() / draws
    stderr = (probs.double() * (1 - probs.double()) / draws).sqrt()
    assert freq[1] == 0
    assert bool(((freq - probs.double()).abs() <= 5 * stderr + 1e-12).all()), freq


@pytest.mark.parametrize("block", [256, 3, 2])
def test_inverse_cdf_edges_never_pick_an_impossible_token(block: int) -> None:
    # u = 0 takes the first possible token; u just below 1 the last possible one, even when
    # u * total rounds up to the total and the tail of the vocabulary (whole blocks of it)
    # has probability 0
    probs = torch.tensor([[0.0, 0.0, 0.0, 0.3, 0.7, 0.0, 0.0, 0.0, 0.0]] * 3)
    uniforms = torch.tensor([0.0, 1.0 - 2**-53, 0.5], dtype=torch.float64)
    assert inverse_cdf(probs, uniforms, block=block).tolist() == [3, 4, 4]


def test_inverse_cdf_in_blocks_draws_what_one_cumulative_sum_draws() -> None:
    """Over a real-sized vocabulary, the two-level search picks the token a plain float64
    cumulative sum picks for the same uniform (rounding aside: all but a handful)."""
    g = torch.Generator().manual_seed(11)
    probs = torch.softmax(torch.randn(64, 49152, generator=g) * 3, dim=-1)
    uniforms = torch.rand(64, dtype=torch.float64, generator=g)
    cdf = probs.double().cumsum(-1)
    plain = torch.searchsorted(cdf, (uniforms * cdf[:, -1]).unsqueeze(-1), right=True)[:, 0]
    assert (inverse_cdf(probs, uniforms) == plain).sum() >= 62


def test_the_reported_logprob_is_the_drawn_tokens() -> None:
    """Whatever token is drawn, its reported logprob is log_softmax(logits / T) at it."""
    logits = torch.randn(8, 300, generator=torch.Generator().manual_seed(5)) * 4
    params = [SamplingParams(temperature=0.7)] * 8
    expected = torch.log_softmax(logits / 0.7, dim=-1)
    for _ in range(20):
        out = sample_next(logits, params, [None] * 8)
        for row, (token, logprob) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            assert logprob == pytest.approx(expected[row, token].item(), abs=1e-5)
