"""The fast decode path against the transformers forward, with the real model in-process:
the same greedy tokens, the same logprobs (to the token-truth bound, 1e-4), samples of one
prompt independent of each other, and a running prompt reused only under its weights."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from inference_helpers import SERVER_FLAGS, chat, forward_logprobs
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from atroposlib.inference.batch import ActiveBatch, Sequence
from atroposlib.inference.engine import ModelRunner
from atroposlib.inference.fast_decode import supports
from atroposlib.inference.kv_cache import PrefixSharedCache
from atroposlib.inference.sampling import SamplingParams

pytestmark = [pytest.mark.model]
TOKEN_TRUTH = 1e-4
"""The bound tests/environments/test_env_token_truth.py puts on |trainer - server| logprobs."""


@pytest.fixture(scope="module")
def runner(test_model_path: Path) -> Iterator[ModelRunner]:
    threads = torch.get_num_threads()
    torch.set_num_threads(int(SERVER_FLAGS[1]))
    yield ModelRunner(test_model_path)
    torch.set_num_threads(threads)


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, temperature=0, ignore_eos=True)


def decode_all(runner: ModelRunner, waves: list[list[Sequence]]) -> None:
    """Prefill ``waves[0]``, then let each later wave join after two more steps; finished
    rows leave as they finish (the rest may be moved into their places)."""
    batch: ActiveBatch | None = None
    pending = list(waves)
    while pending or (batch is not None and len(batch)):
        if pending:
            joined = runner.prefill(pending.pop(0))
            if batch is None:
                batch = joined
            else:
                batch.merge(joined)
        assert batch is not None
        for _ in range(2 if pending else 10_000):
            alive = [i for i, row in enumerate(batch.rows) if not row.finished]
            if not alive:
                return
            if len(alive) < len(batch):
                batch.keep(alive)
            runner.decode(batch)


def mixed_waves(runner: ModelRunner) -> list[list[Sequence]]:
    """A shared prompt (3 rows, different lengths), a lone prompt, a resumed row (prompt plus
    tokens it had), then a second shared prompt and a lone row joining mid-flight."""
    poem = chat(runner, "Write a poem about the sea.")
    cat = chat(runner, "Describe a cat.")
    resumed = Sequence(chat(runner, "Tell me about rain."), greedy(9))
    resumed.output_ids = [504, 3575, 282]
    first = [Sequence(poem, greedy(n)) for n in (5, 12, 8)]
    first += [Sequence(chat(runner, "What is 2+3?"), greedy(10)), resumed]
    second = [Sequence(cat, greedy(n)) for n in (7, 11)] + [Sequence(chat(runner, "Hi"), greedy(4))]
    return [first, second]


def test_the_fast_path_samples_the_tokens_and_logprobs_of_the_transformers_forward(
    runner: ModelRunner,
) -> None:
    assert runner.fast_decode
    fast = mixed_waves(runner)
    decode_all(runner, fast)
    runner.fast_decode = False
    try:
        slow = mixed_waves(runner)
        decode_all(runner, slow)
    finally:
        runner.fast_decode = True
    for wave_fast, wave_slow in zip(fast, slow, strict=True):
        for a, b in zip(wave_fast, wave_slow, strict=True):
            assert a.output_ids == b.output_ids
            assert len(a.logprobs) == a.params.max_new_tokens - (3 if a is fast[0][4] else 0)
            gap = (torch.tensor(a.logprobs) - torch.tensor(b.logprobs)).abs().max()
            assert gap < TOKEN_TRUTH, gap
            # and both are what one forward pass over the finished sequence gives
            lone = forward_logprobs(runner, a)[-len(a.logprobs) :]
            assert (torch.tensor(a.logprobs) - lone).abs().max() < TOKEN_TRUTH


def test_samples_of_one_prompt_are_independent_and_each_exact(runner: ModelRunner) -> None:
    prompt = chat(runner, "Name a colour.")
    rows = [
        Sequence(
            prompt, SamplingParams(max_new_tokens=12, temperature=1.0, seed=s, ignore_eos=True)
        )
        for s in range(6)
    ]
    decode_all(runner, [rows[:4], rows[4:]])  # two joins one running prompt
    assert len({tuple(row.output_ids) for row in rows}) > 3
    for row in rows:
        lone = forward_logprobs(runner, row)
        assert (torch.tensor(row.logprobs) - lone).abs().max() < TOKEN_TRUTH
    again = Sequence(prompt, rows[2].params)  # the same seed alone: the same tokens
    decode_all(runner, [[again]])
    assert again.output_ids == rows[2].output_ids


def test_a_running_prompt_is_reused_only_under_the_weights_that_computed_it(
    runner: ModelRunner,
) -> None:
    prompt = chat(runner, "Say hello.")
    calls: list[int] = []
    hook = runner.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        group = runner.prefill([Sequence(prompt, greedy(3)) for _ in range(2)])
        assert len(calls) == 1
        late = runner.prefill([Sequence(prompt, greedy(3))])
        assert len(calls) == 1, "a row of a running prompt needs no forward"
        assert isinstance(late.cache, PrefixSharedCache)
        assert isinstance(group.cache, PrefixSharedCache)
        assert late.cache.prefix_of[0] is group.cache.prefix_of[0]
        assert late.rows[0].logprobs == group.rows[0].logprobs
        norm = "model.norm.weight"
        runner.install({norm: runner.parameters()[norm].detach().clone()})  # new weights
        fresh = runner.prefill([Sequence(prompt, greedy(3))])
        assert len(calls) == 2, "after an update the prompt is computed again"
        assert isinstance(fresh.cache, PrefixSharedCache)
        assert fresh.cache.prefix_of[0] is None  # a lone row: its own cache
    finally:
        hook.remove()


def _tiny_llama() -> LlamaConfig:
    return LlamaConfig(
        num_hidden_layers=1, vocab_size=64, hidden_size=16, intermediate_size=32,
        num_attention_heads=2,
    )  # fmt: skip


def test_only_architectures_it_knows_take_the_fast_path() -> None:
    llama = AutoModelForCausalLM.from_config(_tiny_llama())
    assert supports(llama)
    gpt2 = AutoModelForCausalLM.from_config(
        GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)
    )
    assert not supports(gpt2)
    windowed = _tiny_llama()
    windowed.layer_types = ["sliding_attention"]
    llama.config = windowed
    assert not supports(llama)


def _computed_rows(runner: ModelRunner) -> tuple[list[int], Any]:
    """Rows each decode step computes (the embedding's batch of one token per row), and the
    hook's handle."""
    seen: list[int] = []

    def record(_module: Any, args: tuple[torch.Tensor, ...], _out: Any) -> None:
        if args[0].shape[1] == 1:
            seen.append(args[0].shape[0])

    return seen, runner.model.get_input_embeddings().register_forward_hook(record)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_rows_with_the_same_context_are_computed_once_and_sample_as_before(
    runner: ModelRunner, temperature: float
) -> None:
    """A group of samples of one prompt (n = 4, seeded) beside a lone prompt: while a
    group's rows have sampled the same tokens, one of them is computed; the tokens and
    logprobs are those of computing every row."""
    prompt, other = chat(runner, "Name a colour."), chat(runner, "Count to three.")

    def rows() -> list[Sequence]:
        params = [SamplingParams(max_new_tokens=10, temperature=temperature, seed=s,
                                 ignore_eos=True) for s in range(5)]  # fmt: skip
        return [Sequence(prompt, p) for p in params[:4]] + [Sequence(other, params[4])]

    # both runs read the prompt's keys from the same cache layout (a prompt kept whole after
    # a tail run would be read whole by the second: equal up to ~1e-5, not what is tested)
    runner.share_prompt_prefixes = False
    runner.share_twin_rows = False
    try:
        every = rows()
        decode_all(runner, [every])
        runner.share_twin_rows = True
        seen, handle = _computed_rows(runner)
        try:
            twins = rows()
            decode_all(runner, [twins])
        finally:
            handle.remove()
    finally:
        runner.share_prompt_prefixes = True
    for a, b in zip(twins, every, strict=True):
        assert a.output_ids == b.output_ids
        assert (torch.tensor(a.logprobs) - torch.tensor(b.logprobs)).abs().max() < 1e-5
    decoded = seen
    assert len(decoded) == 9  # the first token is sampled by the prefill
    if temperature == 0:  # the group never diverges: one row of it, and the lone prompt
        assert decoded == [2] * 9
    else:  # the seeded rows part as their samples differ; each computed once they do, and
        # every row once more than half of them are their own
        distinct = [len({tuple(r.output_ids[: k + 1]) for r in twins[:4]}) + 1 for k in range(9)]
        assert decoded == [n if 2 * n <= 5 else 5 for n in distinct]
        assert max(distinct) > 2
