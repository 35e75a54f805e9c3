"""Distinct prompts with a common beginning: found, run once, reused, and the answers of the
held-out evaluation unchanged (greedy, real test model, the demo's few-shot prompts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from inference_helpers import SERVER_FLAGS

from atroposlib.inference.batch import ActiveBatch, Sequence
from atroposlib.inference.engine import ModelRunner
from atroposlib.inference.kv_cache import PrefixSharedCache, SharedPrefix
from atroposlib.inference.prompt_prefix import (
    MIN_SHARED_TOKENS,
    common_prefix_length,
    live_prefix_of,
)
from atroposlib.inference.sampling import SamplingParams
from tests.environments.envcat_testlib import REPO_ROOT, load_env_module


@pytest.mark.parametrize(
    ("contexts", "expected"),
    [
        ([], 0),
        ([(1, 2, 3)], 2),  # one context keeps its last token
        ([(1, 2, 3, 4), (1, 2, 3, 9)], 3),
        ([(1, 2, 3), (1, 2, 3, 4)], 2),  # the shorter one keeps a token of its own
        ([(5, 2), (1, 2)], 0),
    ],
)
def test_common_prefix_length(contexts: list[tuple[int, ...]], expected: int) -> None:
    assert common_prefix_length(contexts) == expected


def _prefix(tokens: tuple[int, ...], generation: int = 1) -> SharedPrefix:
    empty = torch.zeros(1, 1, len(tokens), 1)
    return SharedPrefix(tokens, empty, empty, generation, torch.zeros(3))


def test_a_live_prefix_is_reused_only_when_the_context_continues_it_under_its_weights() -> None:
    short, long, stale = _prefix((1, 2)), _prefix((1, 2, 3)), _prefix((1, 2, 3, 4), 0)
    running = [short, long, stale]
    assert live_prefix_of((1, 2, 3, 4, 5), running, generation=1) is long  # the longest
    assert live_prefix_of((1, 2, 9), running, generation=1) is short
    assert live_prefix_of((1, 2, 3), running, generation=1) is short  # never the whole context
    assert live_prefix_of((7, 2, 3), running, generation=1) is None
    assert live_prefix_of((1, 2, 3, 4, 5), [stale], generation=1) is None


@pytest.fixture(scope="module")
def runner(test_model_path: Path) -> Iterator[ModelRunner]:
    threads = torch.get_num_threads()
    torch.set_num_threads(int(SERVER_FLAGS[1]))
    yield ModelRunner(test_model_path)
    torch.set_num_threads(threads)


def held_out_prompts(runner: ModelRunner, count: int) -> list[list[int]]:
    """The demo's held-out problems as ``env.py evaluate`` prompts them, rendered as the
    server renders a chat request."""
    env = load_env_module("reasoning_gym")
    settings = yaml.safe_load((REPO_ROOT / "configs/local-cpu-env.yaml").read_text())["env"]
    config = env.ReasoningGymConfig(**{**settings, "eval_size": count, "dataset_size": 100})
    problems = env.build_problems(config)
    questions = [entry["question"] for entries in problems.test.values() for entry in entries]
    tokenizer = runner.tokenizer
    rendered = [
        tokenizer.apply_chat_template(
            env.chat_prompt(config, q), tokenize=False, add_generation_prompt=True
        )
        for q in questions
    ]
    return [list(tokenizer.encode(text, add_special_tokens=False)) for text in rendered]


def greedy_texts(runner: ModelRunner, prompts: list[list[int]], share: bool) -> list[str]:
    """Greedy replies, a first wave prefilled together and a second joining after 3 steps
    (as requests trickle into the scheduler)."""
    runner.share_prompt_prefixes = share
    rows = [Sequence(ids, SamplingParams(max_new_tokens=24, temperature=0)) for ids in prompts]
    half = len(rows) // 2
    batch = runner.prefill(rows[:half])
    if share:  # the first wave continues one prefix: the prompts' common beginning
        assert isinstance(batch.cache, PrefixSharedCache)
        (prefix,) = batch.cache.prefixes()
        assert len(prefix.tokens) == common_prefix_length(prompts[:half]) >= MIN_SHARED_TOKENS
    for _ in range(3):
        runner.decode(batch)
    joined = runner.prefill(rows[half:])
    if share:  # the second wave reuses the running prefix, computing no new one
        assert isinstance(joined.cache, PrefixSharedCache)
        assert joined.cache.prefixes() == [prefix]
    batch.merge(joined)
    _decode_to_the_end(runner, batch)
    return [row.text or "" for row in rows]


def _decode_to_the_end(runner: ModelRunner, batch: ActiveBatch) -> None:
    while True:
        alive = [i for i, row in enumerate(batch.rows) if not row.finished]
        if not alive:
            return
        if len(alive) < len(batch):
            batch.keep(alive)
        runner.decode(batch)


@pytest.mark.model
@pytest.mark.slow
def test_the_held_out_answers_are_the_same_with_the_shared_beginning(runner: ModelRunner) -> None:
    prompts = held_out_prompts(runner, 16)
    before = greedy_texts(runner, prompts, share=False)
    after = greedy_texts(runner, prompts, share=True)
    assert after == before
    assert len(set(after)) > 1  # the replies answer different problems
