"""Token-in/token-out sampling: trajectories hold exactly the ids the engine sampled.

A unit fake engine (:class:`FakeEngine`) answers ``generate`` with chosen ids, so the tests can
sample ids that decode→encode would not give back (the drift the token path must avoid).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest
from envs_testlib import tokenizer_path

from atroposlib.envs import rollouts
from atroposlib.envs.groups import group_rejection_reason, is_no_signal
from atroposlib.envs.rollouts import TokenSampler, greedy_reply, sample_group
from atroposlib.envs.server_handling.server_baseline import GeneratedSequence
from atroposlib.envs.server_handling.sglang_server import parse_sglang_output
from atroposlib.envs.server_handling.vllm_server import parse_vllm_choice
from atroposlib.errors import ContextFullError, InferenceError
from atroposlib.utils.chat_group import chat_group
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
EOS = 2  # SmolLM2's <|im_end|>


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_path())


class FakeEngine:
    """Answers each ``generate`` with the next scripted ids (a unit fake of a token server)."""

    returns_token_ids = True

    def __init__(self, outputs: list[tuple[Any, ...]], version: int | None = 4) -> None:
        self.outputs = list(outputs)
        self.version = version
        self.prompts: list[list[int]] = []
        self.sampling: list[dict[str, Any]] = []

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        self.prompts.append(list(input_ids))
        self.sampling.append(dict(sampling))
        out = []
        for _ in range(n):
            ids, reason, *version = self.outputs.pop(0)  # (ids, reason[, version])
            logprobs = [-0.1 * (j + 1) for j in range(len(ids))]
            out.append(GeneratedSequence(ids, logprobs, reason, None, *version or [self.version]))
        return out


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


async def test_sample_group_trains_exactly_the_sampled_ids(tokenizer: Any) -> None:
    four, five = [*ids(tokenizer, "4"), EOS], ids(tokenizer, "five is")  # length-cut: no eos
    engine = FakeEngine([(four, "stop"), (five, "length")])
    group = await sample_group(
        engine, tokenizer, PROMPT, lambda replies: [float(r == "4") for r in replies],
        n=2, max_tokens=2, temperature=0.7,
    )  # fmt: skip
    prompt_ids = tokenize_for_trainer(tokenizer, [*PROMPT, {"role": "assistant", "content": ""}])
    prompt = engine.prompts[0]
    assert prompt == tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)["input_ids"]
    assert prompt_ids["tokens"][: len(prompt)] == prompt
    assert group.tokens == [prompt + four, prompt + five]
    assert group.masks == [[-100] * len(prompt) + four, [-100] * len(prompt) + five]
    assert group.inference_logprobs is not None
    assert group.inference_logprobs[0] == pytest.approx([1.0] * len(prompt) + [-0.1, -0.2])
    assert group.scores == [1.0, 0.0]
    assert group.finish_reasons == ["stop", "length"] and group.truncated(1)
    assert group.token_policy_versions == [[-1] * len(prompt) + [4] * 2] * 2
    assert group.policy_versions == [4, 4]
    assert group.generation_params == {"temperature": 0.7, "max_tokens": 2}
    assert engine.sampling[0]["temperature"] == 0.7 and engine.sampling[0]["max_tokens"] == 2
    assert group.messages is not None and group.messages[0][-1].content == "4"


async def test_multi_turn_sends_the_exact_prefix_and_adds_only_the_template_delta(
    tokenizer: Any,
) -> None:
    first, second = [*ids(tokenizer, "4"), EOS], [*ids(tokenizer, "6"), EOS]
    engine = FakeEngine([(first, "stop"), (second, "stop")])
    sampler = TokenSampler(engine, tokenizer, max_tokens=8)
    [turn1] = await sampler.sample(sampler.start(PROMPT))
    turn1b = sampler.add_messages(turn1, [{"role": "user", "content": "and 3+3?"}])
    [turn2] = await sampler.sample(turn1b)
    assert engine.prompts[1] == turn1b.tokens, "the second request continues from the ids"
    assert turn2.tokens[: len(turn1.tokens)] == turn1.tokens, "nothing before is re-tokenized"
    chat = [*PROMPT, {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"},
            {"role": "assistant", "content": "6"}]  # fmt: skip
    # with canonical ids the deltas add up to the template of the whole chat (minus its final
    # newline after the last <|im_end|>, which nobody sampled)
    whole = tokenize_for_trainer(tokenizer, chat, train_on_all_assistant_turns=True)
    assert turn2.tokens == whole["tokens"][: len(turn2.tokens)]
    # the text path also trains the template's newline after each <|im_end|>: never sampled
    ours = {i for i, m in enumerate(turn2.masks) if m != -100}
    text = {i for i, m in enumerate(whole["masks"][: len(turn2.masks)]) if m != -100}
    assert ours < text and {turn2.tokens[i] for i in text - ours} == set(ids(tokenizer, "\n"))
    assert turn2.sampled_ids == first + second and turn2.turns == 2


async def test_a_length_cut_turn_is_closed_by_untrained_template_ids(tokenizer: Any) -> None:
    cut = ids(tokenizer, "Let me think")
    engine = FakeEngine([(cut, "length")])
    sampler = TokenSampler(engine, tokenizer, max_tokens=3)
    [turn] = await sampler.sample(sampler.start(PROMPT))
    more = sampler.add_messages(turn, [{"role": "user", "content": "Answer now."}])
    delta = more.tokens[len(turn.tokens) :]
    assert delta[0] == EOS, "the turn's end comes from the template, not from the model"
    assert all(m == -100 for m in more.masks[len(turn.tokens) :])
    assert more.sampled_ids == cut


async def test_drift_pair_keeps_the_sampled_ids_where_retokenizing_changes_them(
    tokenizer: Any,
) -> None:
    """SmolLM2's tokenizer with a template that trims message content: decode -> encode does
    not round-trip for these sampled ids (a non-canonical split and surrounding spaces)."""
    from transformers import AutoTokenizer

    trimming = AutoTokenizer.from_pretrained(tokenizer_path())
    trimming.chat_template = str(tokenizer.chat_template).replace(
        "message['content']", "(message['content'] | trim)"
    )
    sampled = [*ids(trimming, " hel"), *ids(trimming, "lo"), *ids(trimming, " world "), EOS]
    assert ids(trimming, trimming.decode(sampled[:-1])) != sampled[:-1], "not a drift pair"
    engine = FakeEngine([(sampled, "stop"), ([*ids(trimming, "ok"), EOS], "stop")])
    sampler = TokenSampler(engine, trimming, max_tokens=16)
    [turn] = await sampler.sample(sampler.start(PROMPT))
    [turn] = await sampler.sample(sampler.add_messages(turn, [{"role": "user", "content": "?"}]))
    group = sampler.group([turn], [1.0])
    prompt = engine.prompts[0]
    assert group.tokens[0][len(prompt) : len(prompt) + len(sampled)] == sampled
    assert engine.prompts[1][len(prompt) : len(prompt) + len(sampled)] == sampled
    chat = [message.model_dump() for message in group.messages[0]]
    retokenized = chat_group(trimming, [chat], [1.0], train_on_all_assistant_turns=True)
    assert retokenized.tokens[0] != group.tokens[0], "the text path drifts on this pair"


async def test_extra_overrides_and_group_overrides_are_typed(tokenizer: Any) -> None:
    from pydantic import BaseModel

    class Outcome(BaseModel):
        status: str
        seconds: float

    engine = FakeEngine([([5, EOS], "stop"), ([6, EOS], "stop")], version=None)
    sampler = TokenSampler(engine, tokenizer, max_tokens=4)
    replies = await sampler.sample(sampler.start(PROMPT), n=2)
    group = sampler.group(
        replies, [1.0, -1.0],
        overrides=[{"role": "X"}, {"role": "O", "set_advantage_to_zero": True}],
        group_overrides={"group_size": 2},
        extra=[Outcome(status="ok", seconds=0.5), {"status": "timeout"}],
    )  # fmt: skip
    assert group.extra == [{"status": "ok", "seconds": 0.5}, {"status": "timeout"}]
    assert group.override(1, "set_advantage_to_zero") is True and group.override(0, "role") == "X"
    assert group.override(0, "group_size") == 2
    assert group.token_policy_versions is None and group.policy_versions is None
    with pytest.raises(ValueError, match="sft"):
        sampler.group(replies, [1.0, 0.0], overrides=[{"sft": "yes"}, {}])
    with pytest.raises(ValueError, match="2 trajectories but 1 scores"):
        sampler.group(replies, [1.0])


class TextOnlyServer:
    """A server without token ids (server_type openai): chat completions only."""

    returns_token_ids = False

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def chat_completion(self, **kwargs: Any) -> Any:
        from openai.types.chat import ChatCompletion

        self.calls.append(kwargs)
        choices = [{"index": i, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": f"{i}"}}
                   for i in range(kwargs["n"])]  # fmt: skip
        body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m"}
        return ChatCompletion.model_validate({**body, "choices": choices})


async def test_a_text_only_server_falls_back_with_a_warning_and_no_logprobs(
    tokenizer: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rollouts, "_warned_text_fallback", False)
    server = TextOnlyServer()
    with caplog.at_level(logging.WARNING):
        group = await sample_group(server, tokenizer, PROMPT, lambda r: [1.0, 0.0], n=2,
                                   max_tokens=4)  # fmt: skip
    assert "re-tokenized from text" in caplog.text
    assert group.inference_logprobs is None and group.finish_reasons == ["stop", "stop"]
    assert server.calls[0]["messages"] == PROMPT and server.calls[0]["n"] == 2
    assert group.masks[0][-2:] == [*ids(tokenizer, "0"), EOS]


async def test_greedy_reply_uses_eval_capacity_at_temperature_zero() -> None:
    server = TextOnlyServer()
    assert await greedy_reply(server, PROMPT, max_tokens=5) == "0"
    assert server.calls[0]["temperature"] == 0.0 and server.calls[0]["split"] == "eval"


def test_engines_that_continue_from_other_ids_are_errors() -> None:
    meta = {"output_token_logprobs": [[-0.1, 5, None]], "finish_reason": {"type": "stop"},
            "prompt_tokens": 9, "weight_version": "7"}  # fmt: skip
    entry = {"output_ids": [5], "meta_info": meta}
    assert parse_sglang_output(entry, 9).weight_version == 7
    with pytest.raises(InferenceError, match="9 prompt tokens but 8 were sent"):
        parse_sglang_output(entry, 8)
    choice = {"token_ids": [5], "prompt_token_ids": [1, 2], "finish_reason": "stop",
              "logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.1]}}  # fmt: skip
    assert parse_vllm_choice(choice, [1, 2]).output_ids == [5]
    with pytest.raises(InferenceError, match="differ"):
        parse_vllm_choice(choice, [1, 3])


async def test_an_aborted_reply_is_resubmitted_token_in_and_continued(tokenizer: Any) -> None:
    """An engine aborts mid-reply (a weight update in abort mode): the sampler resubmits the
    prompt and the partial ids with the budget left until the reply ends; the trained ids are
    the pieces' concatenation and each id keeps the version that sampled it."""
    head, middle, tail = (
        ids(tokenizer, "The"),
        ids(tokenizer, " answer"),
        [*ids(tokenizer, " is 4"), EOS],
    )
    engine = FakeEngine([(head, "abort", 3), (middle, "abort", 4), (tail, "stop", 4)])
    sampler = TokenSampler(engine, tokenizer, max_tokens=12)
    start = sampler.start(PROMPT)
    [done] = await sampler.sample(start)
    prompt = start.tokens
    assert engine.prompts == [prompt, prompt + head, prompt + head + middle]
    assert [p["max_tokens"] for p in engine.sampling] == [
        12,
        12 - len(head),
        12 - len(head + middle),
    ]
    assert done.sampled_ids == head + middle + tail and done.turns == 1
    assert done.finish_reason == "stop"
    assert done.reply == "The answer is 4" and done.messages[-1]["content"] == "The answer is 4"
    group = sampler.group([done], [1.0])
    assert group.token_policy_versions is not None
    sampled = len(head + middle + tail)
    assert group.token_policy_versions[0][-sampled:] == [3] * len(head) + [4] * (
        sampled - len(head)
    )
    assert group.policy_versions == [3], "staleness counts from the oldest token"


async def test_an_aborted_reply_with_no_budget_left_ends_as_length(tokenizer: Any) -> None:
    engine = FakeEngine([([5, 6, 7], "abort")])
    sampler = TokenSampler(engine, tokenizer, max_tokens=3)
    [done] = await sampler.sample(sampler.start(PROMPT))
    assert done.finish_reason == "length" and len(engine.prompts) == 1


async def test_resubmissions_fit_the_budget_and_the_room_max_token_length_leaves(
    tokenizer: Any,
) -> None:
    engine = FakeEngine([([5, 6], "abort"), ([7, 8, 9], "abort"), ([10], "length")])
    probe = TokenSampler(engine, tokenizer, max_tokens=20).start(PROMPT)
    room = 8  # tokens past the prompt that max_token_length leaves
    sampler = TokenSampler(
        engine, tokenizer, max_tokens=20, max_token_length=len(probe.tokens) + room
    )
    [done] = await sampler.sample(sampler.start(PROMPT))
    assert [p["max_tokens"] for p in engine.sampling] == [room, room - 2, room - 5]
    assert done.sampled_ids == [5, 6, 7, 8, 9, 10] and done.finish_reason == "length"


async def test_a_server_that_always_aborts_is_an_error(tokenizer: Any) -> None:
    engine = FakeEngine([([5], "abort")] + [([], "abort")] * rollouts.MAX_RESUBMISSIONS)
    sampler = TokenSampler(engine, tokenizer, max_tokens=3)
    with pytest.raises(InferenceError, match="aborted 100 times"):
        await sampler.sample(sampler.start(PROMPT))


async def test_engine_version_spans_become_per_token_versions(tokenizer: Any) -> None:
    """vLLM/embedded spans (a reply that crossed an in-flight update) are kept per token."""
    entry = {
        "text": "x", "output_ids": [5, 6, 7],
        "meta_info": {
            "output_token_logprobs": [[-0.1, 5, None], [-0.2, 6, None], [-0.3, 7, None]],
            "finish_reason": {"type": "stop"}, "prompt_tokens": 2, "weight_version": 1,
            "weight_versions": [{"version": "1", "start": 0, "end": 1},
                                {"version": "2", "start": 1, "end": 3}],
        },
    }  # fmt: skip
    seq = parse_sglang_output(entry, 2)
    assert seq.token_versions == [1, 2, 2] and seq.weight_version == 1
    choice = {"token_ids": [5, 6], "finish_reason": "length",
              "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.1, -0.2]},
              "weight_versions": [{"version": "8", "start": 0, "end": 2}]}  # fmt: skip
    assert parse_vllm_choice(choice).token_versions == [8, 8]
    gap = [{"version": "1", "start": 0, "end": 1}, {"version": "2", "start": 2, "end": 3}]
    bad = {**entry, "meta_info": {**entry["meta_info"], "weight_versions": gap}}
    with pytest.raises(InferenceError, match="malformed"):
        parse_sglang_output(bad, 2)

    class SpanEngine(FakeEngine):
        async def generate(self, input_ids: list[int], n: int, sampling: dict[str, Any]) -> Any:
            return [seq]

    sampler = TokenSampler(SpanEngine([]), tokenizer, max_tokens=3)
    [reply] = await sampler.sample(sampler.start(PROMPT))
    assert reply.versions[-3:] == [1, 2, 2] and reply.oldest_version == 1


async def test_a_per_call_temperature_is_refused(tokenizer: Any) -> None:
    sampler = TokenSampler(FakeEngine([]), tokenizer, max_tokens=4)
    with pytest.raises(ValueError, match="TokenSampler per temperature"):
        await sampler.sample(sampler.start(PROMPT), temperature=0.3)


async def test_max_token_length_caps_each_reply_to_the_room_left(tokenizer: Any) -> None:
    engine = FakeEngine([([7, 8, 9], "length")])
    start = TokenSampler(engine, tokenizer, max_tokens=64).start(PROMPT)
    limit = len(start.tokens) + 3
    sampler = TokenSampler(engine, tokenizer, max_tokens=64, max_token_length=limit, split="eval")
    [reply] = await sampler.sample(start)
    assert engine.sampling[0]["max_tokens"] == 3 and len(reply.tokens) == limit
    assert "split" not in sampler.generation_params  # a scheduling hint, not a sampling setting
    with pytest.raises(ContextFullError, match=f"max_token_length is {limit}"):
        await sampler.sample(reply)
    assert len(engine.prompts) == 1  # nothing sent when there is no room


def right_or_wrong(replies: list[str]) -> list[float]:
    return [float(reply == "4") for reply in replies]


async def test_a_screened_group_whose_first_replies_agree_stops_there(tokenizer: Any) -> None:
    four, five = [*ids(tokenizer, "4"), EOS], [*ids(tokenizer, "5"), EOS]
    engine = FakeEngine([(five, "stop"), (five, "stop"), (four, "stop"), (four, "stop")])
    group = await sample_group(engine, tokenizer, PROMPT, right_or_wrong, n=4, max_tokens=2,
                               screen=2)  # fmt: skip
    assert len(engine.prompts) == 1 and len(engine.outputs) == 2, "the other two never sampled"
    assert group.scores == [0.0, 0.0]
    assert group.group_overrides is not None and group.group_overrides.group_size == 2
    reason = group_rejection_reason(group, group_size=4, max_token_len=0,
                                    ensure_scores_are_not_same=True)  # fmt: skip
    assert reason is not None and is_no_signal(reason), reason


async def test_a_screened_group_whose_first_replies_differ_is_sampled_whole(tokenizer: Any) -> None:
    four, five = [*ids(tokenizer, "4"), EOS], [*ids(tokenizer, "5"), EOS]
    engine = FakeEngine([(five, "stop"), (four, "stop"), (four, "stop"), (five, "stop")])
    group = await sample_group(engine, tokenizer, PROMPT, right_or_wrong, n=4, max_tokens=2,
                               screen=2)  # fmt: skip
    assert engine.prompts[0] == engine.prompts[1], "the rest continue the same prompt"
    assert group.scores == [0.0, 1.0, 1.0, 0.0] and group.group_overrides is None
    assert group_rejection_reason(group, group_size=4, max_token_len=0,
                                  ensure_scores_are_not_same=True) is None  # fmt: skip


@pytest.mark.parametrize("screen", [-1, 4, 5])
async def test_a_screen_of_the_whole_group_or_more_is_refused(tokenizer: Any, screen: int) -> None:
    with pytest.raises(ValueError, match="fewer replies than n"):
        await sample_group(FakeEngine([]), tokenizer, PROMPT, right_or_wrong, n=4, max_tokens=2,
                           screen=screen)  # fmt: skip


async def test_a_settled_first_reply_stops_its_group_and_an_unsure_one_does_not(
    tokenizer: Any,
) -> None:
    """FakeEngine gives token j of a reply the logprob -0.1 * (j + 1): "4" then EOS sums to
    -0.3. Settled at -0.5 the group stops after one reply; at -0.2 the rest are sampled."""
    four = [*ids(tokenizer, "4"), EOS]
    assert len(four) == 2
    settled = FakeEngine([(four, "stop"), (four, "stop")])
    group = await sample_group(settled, tokenizer, PROMPT, right_or_wrong, n=2, max_tokens=2,
                               screen=1, settled_logprob=-0.5)  # fmt: skip
    assert group.scores == [1.0] and len(settled.outputs) == 1
    assert group.group_overrides is not None and group.group_overrides.screened
    reason = group_rejection_reason(group, group_size=2, max_token_len=0,
                                    ensure_scores_are_not_same=True)  # fmt: skip
    assert reason is not None and is_no_signal(reason), "a group of one is dropped too"
    unsure = FakeEngine([(four, "stop"), (four, "stop")])
    group = await sample_group(unsure, tokenizer, PROMPT, right_or_wrong, n=2, max_tokens=2,
                               screen=1, settled_logprob=-0.2)  # fmt: skip
    assert group.scores == [1.0, 1.0] and not unsure.outputs and group.group_overrides is None


def test_a_reply_re_tokenized_from_text_has_no_logprob_to_settle_on(tokenizer: Any) -> None:
    sampler = TokenSampler(FakeEngine([]), tokenizer, max_tokens=4)
    start = sampler.start(PROMPT)
    reply = start.with_sample([5, 6], [-0.5, -0.25], 1, "stop", "x")
    assert rollouts.reply_logprob(reply) == pytest.approx(-0.75)
    assert rollouts.reply_logprob(replace(reply, exact=False)) is None
    assert rollouts.reply_logprob(start.with_sample([5], None, 1, "stop", "x")) is None
