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
    SNAP_TOKENS,
    beginning_to_continue,
    common_prefix_length,
    live_prefix_of,
    shared_length,
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


def _keyed_prefix(tokens: tuple[int, ...], generation: int = 1) -> SharedPrefix:
    """A prefix whose keys at position i hold i (to check which positions a cut keeps)."""
    keys = torch.arange(len(tokens), dtype=torch.float32).view(1, 1, -1, 1)
    return SharedPrefix(tokens, keys, keys.clone(), generation, torch.zeros(3))


def test_shared_length_leaves_the_context_a_token_of_its_own() -> None:
    assert shared_length((1, 2, 3), (1, 2, 3, 4)) == 2
    assert shared_length((1, 2, 3, 4), (1, 2, 3)) == 3
    assert shared_length((9, 2), (1, 2)) == 0


def test_a_new_group_continues_the_beginning_it_shares_with_an_earlier_prompt() -> None:
    examples = tuple(range(100, 100 + MIN_SHARED_TOKENS + 20))  # the worked examples
    earlier = _keyed_prefix((*examples, 7, 8, 9))  # an earlier group's whole prompt
    context = (*examples, 5, 6)  # the next question
    found = beginning_to_continue(context, [earlier], generation=1)
    assert found is not None and found.tokens == examples
    assert found.last_logits is None  # a cut is continued, never sampled from
    assert found.keys.shape[2] == len(examples)
    assert found.keys.data_ptr() == earlier.keys.data_ptr()  # a view: nothing recomputed
    assert found.keys[0, 0, :, 0].tolist() == list(range(len(examples)))


def test_a_whole_prefix_is_preferred_unless_a_cut_is_much_longer() -> None:
    examples = tuple(range(100, 100 + MIN_SHARED_TOKENS + 40))
    whole = _keyed_prefix(examples[: -SNAP_TOKENS - 1])  # continued whole by the context
    near = _keyed_prefix((*examples[:-1], 1))  # shares SNAP_TOKENS more tokens
    far = _keyed_prefix((*examples, 1))  # shares SNAP_TOKENS + 1 more
    context = (*examples, 2, 3)
    assert beginning_to_continue(context, [whole, near], generation=1) is whole
    found = beginning_to_continue(context, [whole, far], generation=1)
    assert found is not None and found.tokens == examples


def test_no_beginning_from_other_weights_or_too_short_a_match() -> None:
    examples = tuple(range(100, 100 + MIN_SHARED_TOKENS + 5))
    stale = _keyed_prefix((*examples, 7), generation=0)
    short = _keyed_prefix((*examples[: MIN_SHARED_TOKENS - 1], 9))
    context = (*examples, 5)
    assert beginning_to_continue(context, [stale], generation=1) is None
    assert beginning_to_continue(context, [short], generation=1) is None


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


def sampled_groups(runner: ModelRunner, prompts: list[list[int]], share: bool) -> list[str]:
    """Groups of 4 greedy replies, each group prefilled after the previous one started (as a
    GRPO env's requests arrive), every row decoded to its end."""
    runner.share_prompt_prefixes = share
    runner.weights_generation += 1  # nothing computed before counts
    groups = [
        [Sequence(ids, SamplingParams(max_new_tokens=16, temperature=0)) for _ in range(4)]
        for ids in prompts
    ]
    batch = runner.prefill(groups[0])
    first_prefix = batch.cache.prefixes() if share else []
    for group in groups[1:]:
        runner.decode(batch)
        joined = runner.prefill(group)
        if share:  # the new group runs its question only, after the examples computed once
            assert isinstance(joined.cache, PrefixSharedCache)
            (prefix,) = joined.cache.prefixes()
            assert prefix.last_logits is None  # a cut of the first group's prompt
            assert prefix.keys.data_ptr() == first_prefix[0].keys.data_ptr()
            assert len(prefix.tokens) >= common_prefix_length(prompts) >= MIN_SHARED_TOKENS
            assert len(prefix.tokens) < len(group[0].context_ids)
        batch.merge(joined)
    _decode_to_the_end(runner, batch)
    return [row.text or "" for group in groups for row in group]


@pytest.mark.model
@pytest.mark.slow
def test_groups_that_continue_an_earlier_groups_beginning_answer_the_same(
    runner: ModelRunner,
) -> None:
    prompts = held_out_prompts(runner, 4)
    before = sampled_groups(runner, prompts, share=False)
    after = sampled_groups(runner, prompts, share=True)
    assert after == before
    assert len(set(after)) > 1


def greedy_turns(runner: ModelRunner, prompts: list[list[int]], share: bool) -> list[list[int]]:
    """Two turns of two conversations prefilled together: each second turn is its first
    turn's prompt, reply and a new message. The ids each turn sampled; ``share`` is checked
    to run only the second turns' new ids."""
    runner.share_prompt_prefixes = share
    runner.weights_generation += 1  # nothing computed before counts
    first = [Sequence(ids, SamplingParams(max_new_tokens=8, temperature=0)) for ids in prompts]
    _decode_to_the_end(runner, runner.prefill(first))
    message = runner.tokenizer.encode("\nAnd the next one?", add_special_tokens=False)
    contexts = [[*row.context_ids, *message] for row in first]
    second = [Sequence(ids, SamplingParams(max_new_tokens=8, temperature=0)) for ids in contexts]
    computed = runner.prompt_tokens_computed
    batch = runner.prefill(second)
    if share:  # each continues its first prompt, kept whole: its reply and message run
        ran = runner.prompt_tokens_computed - computed
        assert ran == sum(len(c) - len(p) for c, p in zip(contexts, prompts, strict=True))
    _decode_to_the_end(runner, batch)
    return [list(row.output_ids) for row in first + second]


@pytest.mark.model
@pytest.mark.slow
def test_a_conversations_next_turn_continues_its_last_prompt_and_answers_the_same(
    runner: ModelRunner,
) -> None:
    prompts = held_out_prompts(runner, 2)
    before = greedy_turns(runner, prompts, share=False)
    after = greedy_turns(runner, prompts, share=True)
    assert after == before
