"""The batch machinery with the real model in-process: rows joining and leaving mid-flight
produce exactly the tokens and log-probabilities a lone forward pass gives, on both decode
paths (the fast path's shared-prompt cache and the transformers forward)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from inference_helpers import SERVER_FLAGS, chat, forward_logprobs

from atroposlib.inference.batch import PaddedCache, Sequence
from atroposlib.inference.engine import ModelRunner
from atroposlib.inference.kv_cache import PrefixSharedCache
from atroposlib.inference.sampling import SamplingParams

pytestmark = [pytest.mark.model]


@pytest.fixture(scope="module")
def loaded_runner(test_model_path: Path) -> Iterator[ModelRunner]:
    threads = torch.get_num_threads()
    torch.set_num_threads(int(SERVER_FLAGS[1]))  # as the test servers run
    yield ModelRunner(test_model_path)
    torch.set_num_threads(threads)


@pytest.fixture(params=["fast", "transformers"])
def runner(loaded_runner: ModelRunner, request: pytest.FixtureRequest) -> Iterator[ModelRunner]:
    assert loaded_runner.fast_decode, "the test model's architecture has the fast path"
    loaded_runner.fast_decode = request.param == "fast"
    yield loaded_runner
    loaded_runner.fast_decode = True


def run_to_end(runner: ModelRunner, batch: Any) -> None:
    while len(batch):
        runner.decode(batch)
        alive = [i for i, row in enumerate(batch.rows) if not row.finished]
        if alive and len(alive) < len(batch):
            batch.keep(alive)
        elif not alive:
            return


def test_rows_joining_and_leaving_keep_exact_logprobs(runner: ModelRunner) -> None:
    short = Sequence(chat(runner, "What is 2+3?"), SamplingParams(max_new_tokens=4, temperature=0))
    long = Sequence(
        chat(runner, "Write a poem about the sea, the wind and the stars."),
        SamplingParams(max_new_tokens=10, temperature=0.8, seed=1, ignore_eos=True),
    )
    late = Sequence(
        runner.tokenizer.encode("The capital of France is"),
        SamplingParams(max_new_tokens=6, temperature=1.0, seed=3, ignore_eos=True),
    )
    batch = runner.prefill([short, long])
    for _ in range(3):
        runner.decode(batch)
    batch.keep([i for i, row in enumerate(batch.rows) if not row.finished])
    batch.merge(runner.prefill([late]))  # joins a batch whose cache is longer than its prompt
    run_to_end(runner, batch)
    assert short.finish_reason == "length" and len(short.output_ids) == 4
    assert len(long.output_ids) == 10 and len(late.output_ids) == 6
    for seq in (short, long, late):
        served = torch.tensor(seq.logprobs)
        assert torch.allclose(served, forward_logprobs(runner, seq), atol=1e-3)


def test_greedy_in_a_batch_equals_greedy_alone(runner: ModelRunner) -> None:
    prompts = [chat(runner, q) for q in ("What is 2+3?", "Name a colour.", "Say hello.")]
    params = SamplingParams(max_new_tokens=7, temperature=0)
    alone = []
    for prompt in prompts:
        seq = Sequence(prompt, params)
        run_to_end(runner, runner.prefill([seq]))
        alone.append(seq.output_ids)
    together = [Sequence(p, params) for p in prompts]
    run_to_end(runner, runner.prefill(together))
    assert [seq.output_ids for seq in together] == alone
    assert (
        runner.tokenizer.decode(alone[0], skip_special_tokens=True) == "2 + 3 = 5"
    )  # eos is the 8th


def test_stop_strings_cut_the_text_and_stop_the_row(runner: ModelRunner) -> None:
    seq = Sequence(
        chat(runner, "What is 2+3?"),
        SamplingParams(max_new_tokens=20, temperature=0, stop=("3 =",)),
    )
    run_to_end(runner, runner.prefill([seq]))
    assert seq.finish_reason == "stop" and seq.matched_stop == "3 ="
    assert seq.text == "2 + "


def test_a_shared_prompt_is_run_once_and_each_row_samples_on_its_own(runner: ModelRunner) -> None:
    prompt = chat(runner, "Name a colour.")
    rows = [
        Sequence(prompt, SamplingParams(max_new_tokens=5, temperature=1.0, seed=s, ignore_eos=True))
        for s in range(4)
    ]
    rows.append(Sequence(chat(runner, "Hi"), SamplingParams(max_new_tokens=5, temperature=0)))
    batch = runner.prefill(rows)
    if isinstance(batch.cache, PrefixSharedCache):  # one shared prompt; the lone row's own
        assert [prefix.tokens for prefix in batch.cache.prefixes()] == [tuple(prompt)]
        assert batch.cache.prefix_of[4] is None and int(batch.cache.lengths[4]) == len(
            rows[4].prompt_ids
        )
    else:
        assert isinstance(batch.cache, PaddedCache) and len(batch.cache) == 5
    run_to_end(runner, batch)
    assert len({tuple(row.output_ids) for row in rows[:4]}) > 1
    for seq in rows:
        assert torch.allclose(torch.tensor(seq.logprobs), forward_logprobs(runner, seq), atol=1e-3)


async def test_preempted_rows_resume_with_the_tokens_they_would_have_had(
    runner: ModelRunner,
) -> None:
    """A small job preempts a row of a bigger one; the resumed row recomputes its prompt and
    tokens and goes on exactly as if it had never left (greedy ids, logprobs to 1e-3)."""
    from atroposlib.inference.scheduler import Scheduler

    questions = ["Write a poem about the sea.", "Describe a cat.", "Tell me about rain."]
    params = SamplingParams(max_new_tokens=24, temperature=0, ignore_eos=True)
    alone = []
    for question in questions:
        seq = Sequence(chat(runner, question), params)
        run_to_end(runner, runner.prefill([seq]))
        alone.append(seq)
    scheduler = Scheduler(runner, max_batch_size=2)
    scheduler.start()
    try:
        big = scheduler.submit([Sequence(chat(runner, q), params) for q in questions])
        while scheduler.stats.sequences_running < 2:
            await asyncio.sleep(0.01)
        small = Sequence(chat(runner, "Hi"), SamplingParams(max_new_tokens=2, temperature=0))
        await asyncio.wait_for(scheduler.generate([small]), 120)
        done = await asyncio.wait_for(big.result(), 300)
        assert scheduler.stats.preemptions >= 1
    finally:
        scheduler.stop()
    assert [seq.output_ids for seq in done] == [seq.output_ids for seq in alone]
    for served, reference in zip(done, alone, strict=True):
        assert torch.allclose(
            torch.tensor(served.logprobs), torch.tensor(reference.logprobs), atol=1e-3
        )
