"""The adapters without a model: template messages, failure accounting, configuration errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from adapters_testlib import GUESS_SERVER, write_vf_envs
from envs_testlib import tokenizer_path

from atroposlib.envs.adapters import stop
from atroposlib.envs.adapters.chat import template_messages
from atroposlib.envs.adapters.openenv_env import OpenEnvConfig, OpenEnvEnv, failure_cause
from atroposlib.envs.adapters.verifiers_env import VerifiersEnv, VerifiersEnvConfig
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, GeneratedSequence
from atroposlib.envs.trajectory import ChatTemplate
from atroposlib.errors import ConfigError, InferenceUnavailableError

EMBEDDED = [APIServerConfig(base_url="http://127.0.0.1:9/v1", server_type="embedded")]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_path())


class ScriptedTokens:
    """A token server that always replies ``text`` (or raises ``error``)."""

    def __init__(self, tokenizer: Any, text: str, error: Exception | None = None) -> None:
        self.ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        self.error = error
        self.calls = 0

    async def generate(self, input_ids: list[int], n: int, sampling: dict[str, Any]) -> list:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return [GeneratedSequence(list(self.ids), [-0.5] * len(self.ids), "stop", None, 3)] * n


def test_tools_go_to_the_system_prompt_when_the_template_has_no_tools(tokenizer: Any) -> None:
    template = ChatTemplate(tokenizer)
    tool = {"name": "lookup", "description": "Look up a fact.", "parameters": {}}
    asked = {
        "role": "assistant",
        "content": [{"type": "text", "text": "Let me see."}],
        "tool_calls": [{"id": "c1", "function": {"name": "lookup", "arguments": "{}"}}],
    }
    chat, tools = template_messages(template, [{"role": "user", "content": "x"}, asked], [tool])
    assert tools is None and not template.renders_tools
    assert chat[0]["role"] == "system" and '"name": "lookup"' in chat[0]["content"]
    assert chat[2]["content"] == (
        'Let me see.\n<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
    )
    text = tokenizer.decode(template.prompt_ids(chat))
    assert '"name": "lookup"' in text and "<tool_call>" in text


def make_vf_env(tmp_path: Path, tokenizer: Any, **settings: Any) -> VerifiersEnv:
    sys.path.insert(0, str(write_vf_envs(tmp_path)))
    defaults = {"group_size": 2, "vf_env": "vf_sum"}
    config = VerifiersEnvConfig(
        tokenizer_name=tokenizer_path(),
        use_wandb=False,
        ensure_scores_are_not_same=False,
        **{**defaults, **settings},
    )
    env = VerifiersEnv(config, EMBEDDED)
    env.tokenizer = tokenizer
    return env


async def test_a_crashing_reward_function_drops_the_group_and_counts_it(
    tmp_path: Path, tokenizer: Any
) -> None:
    env = make_vf_env(tmp_path, tokenizer, vf_args={"broken": True})
    await env.setup()
    env.server.generate = ScriptedTokens(tokenizer, "4").generate  # type: ignore[method-assign]
    assert await env.run_item(await env.get_next_item(), max_token_len=-1) == []
    assert env.failures == {"env_error/TaskError": 1}
    await env.close()


async def test_an_inference_failure_is_not_a_zero_reward(tmp_path: Path, tokenizer: Any) -> None:
    env = make_vf_env(tmp_path, tokenizer)
    await env.setup()
    down = ScriptedTokens(tokenizer, "", InferenceUnavailableError("server down"))
    env.server.generate = down.generate  # type: ignore[method-assign]
    item = await env.get_next_item()
    assert await env.run_item(item, max_token_len=-1) == []
    assert env.failures == {"inference": 1}
    assert env.backlog == [item]  # retried later, never scored
    await env.close()


async def test_a_scripted_group_carries_each_reward_function(
    tmp_path: Path, tokenizer: Any
) -> None:
    env = make_vf_env(tmp_path, tokenizer)
    await env.setup()
    env.server.generate = ScriptedTokens(tokenizer, "2").generate  # type: ignore[method-assign]
    [group] = await env.run_item(await env.get_next_item(), max_token_len=-1)
    for score, extra in zip(group["scores"], group["extra"], strict=True):
        rewards = extra["vf_rewards"]
        assert set(rewards) == {"correct_answer", "short_answer"}
        assert score == pytest.approx(rewards["correct_answer"] + 0.5 * rewards["short_answer"])
    assert group["finish_reasons"] == ["stop", "stop"]
    assert group["policy_versions"] == [3, 3]  # the engine's weight version, per reply
    for masks, versions in zip(group["masks"], group["token_policy_versions"], strict=True):
        assert [v for m, v in zip(masks, versions, strict=True) if m != -100] == [3] * 2
        assert {v for m, v in zip(masks, versions, strict=True) if m == -100} == {-1}
    assert group["generation_params"]["temperature"] == 1.0
    await env.close()


class ScriptedTurns:
    """A token server whose n-th reply is ``texts[n]`` (the last one repeated)."""

    def __init__(self, tokenizer: Any, texts: list[str]) -> None:
        self.replies = [
            [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
            for text in texts
        ]
        self.calls = 0

    async def generate(self, input_ids: list[int], n: int, sampling: dict[str, Any]) -> list:
        ids = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        return [GeneratedSequence(list(ids), [-0.25] * len(ids), "stop", None, 0)] * n


async def test_a_tool_environment_calls_its_mcp_tool_and_trains_only_the_replies(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", f"{write_vf_envs(tmp_path)}:{os.environ.get('PYTHONPATH', '')}"
    )
    env = make_vf_env(tmp_path, tokenizer, vf_env="vf_add", group_size=1)
    await env.setup()
    call = '<tool_call>{"name": "add", "arguments": {"a": 0, "b": 40}}</tool_call>'
    env.server.generate = ScriptedTurns(tokenizer, [call, "It is 40."]).generate  # type: ignore[method-assign]
    [group] = await env.run_item(await env.get_next_item(), max_token_len=-1)
    assert group["scores"] == [1.0]
    assert group["extra"] == [{"vf_rewards": {"correct": 1.0}, "vf_metrics": {"tool_calls": 1.0}}]
    tokens, masks = group["tokens"][0], group["masks"][0]
    trained = tokenizer.decode([t for t in masks if t != -100])
    context = tokenizer.decode([t for t, m in zip(tokens, masks, strict=True) if m == -100])
    assert trained == f"{call}<|im_end|>It is 40.<|im_end|>"
    assert '"name": "add"' in context and "tool\n40<|im_end|>" in context  # listed, answered
    await env.close()


async def test_unknown_environment_and_openai_server_are_config_errors(
    tmp_path: Path, tokenizer: Any
) -> None:
    env = make_vf_env(tmp_path, tokenizer)
    env.config.vf_env = "no_such_verifiers_env"
    with pytest.raises(ConfigError, match="no_such_verifiers_env"):
        await env.setup()
    plain = VerifiersEnv(VerifiersEnvConfig(vf_env="vf_sum", use_wandb=False),
                         [APIServerConfig(base_url="http://127.0.0.1:9/v1")])  # fmt: skip
    with pytest.raises(ConfigError, match="server_type"):
        await plain.setup()


def make_openenv(tokenizer: Any, **settings: Any) -> OpenEnvEnv:
    command = f"{sys.executable} {GUESS_SERVER} --port {{port}}"
    config = OpenEnvConfig(tokenizer_name=tokenizer_path(), group_size=2, use_wandb=False,
                           ensure_scores_are_not_same=False,
                           openenv_command=command, **settings)  # fmt: skip
    env = OpenEnvEnv(config, EMBEDDED)
    env.tokenizer = tokenizer
    return env


async def test_openenv_server_errors_drop_the_group_by_cause(tokenizer: Any) -> None:
    env = make_openenv(tokenizer)
    await env.setup()
    try:
        env.server.generate = ScriptedTokens(tokenizer, "crash").generate  # type: ignore[method-assign]
        assert await env.run_item(await env.get_next_item(), max_token_len=-1) == []
        assert env.failures == {"server_error/EXECUTION_ERROR": 1}
        env.server.generate = ScriptedTokens(tokenizer, "7").generate  # type: ignore[method-assign]
        [group] = await env.run_item(await env.get_next_item(), max_token_len=-1)
        assert all(extra["openenv_steps"] >= 1 for extra in group["extra"])
        await stop(env._server_task)  # the server is gone: the next episode cannot reach it
        assert await env.run_item(await env.get_next_item(), max_token_len=-1) == []
        assert env.failures["server_unreachable"] == 1
    finally:
        await env.close()


async def test_openenv_action_field_is_checked_against_the_schema(tokenizer: Any) -> None:
    env = make_openenv(tokenizer, action_field="move")
    try:
        with pytest.raises(ConfigError, match=r"'move' is not a field.*\['message'\]"):
            await env.setup()
    finally:
        await env.close()


def test_failure_causes() -> None:
    assert failure_cause(InferenceUnavailableError("x")) == "inference"
    assert failure_cause(RuntimeError("Server error: boom (code: EXECUTION_ERROR)")) == (
        "server_error/EXECUTION_ERROR"
    )
    assert failure_cause(ConnectionError("refused")) == "server_unreachable"


async def test_evaluate_runs_the_eval_split_and_keeps_each_reward(
    tmp_path: Path, tokenizer: Any
) -> None:
    env = make_vf_env(tmp_path, tokenizer, vf_eval_args={"size": 3, "offset": 10}, eval_size=2)
    env.config.data_dir_to_save_evals = str(tmp_path / "evals")
    await env.setup()
    env.server.generate = ScriptedTokens(tokenizer, "12").generate  # type: ignore[method-assign]
    await env.evaluate()
    metrics = env.last_eval_metrics
    assert metrics["eval/episodes"] == 2.0 and metrics["eval/failed"] == 0.0
    assert metrics["eval/reward/correct_answer"] == 0.5  # "12" answers 10+2, not 11+2
    assert env.last_eval_samples[0]["prompt"].startswith("What is 10 + 2?")
    assert (tmp_path / "evals" / "metrics.json").exists()
    await env.close()


async def test_openenv_evaluate_plays_greedy_episodes(tokenizer: Any) -> None:
    env = make_openenv(tokenizer, eval_size=3)
    await env.setup()
    try:
        env.server.generate = ScriptedTokens(tokenizer, "7").generate  # type: ignore[method-assign]
        await env.evaluate()
        assert env.last_eval_metrics["eval/failed"] == 0.0
        assert len(env.last_eval_samples) == 3
        assert all(s["score"] in (1.0, 0.2, 1.1) for s in env.last_eval_samples)
    finally:
        await env.close()
