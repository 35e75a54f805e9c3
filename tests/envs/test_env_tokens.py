"""Token-level paths with the real SmolLM2 tokenizer: tokenize_for_trainer and managed mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from envs_testlib import Process, tokenizer_path

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.vllm_server import parse_vllm_choice
from atroposlib.errors import ConfigError, InferenceError
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_path())


CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "6"},
]


def trained_text(tokenizer: Any, out: dict[str, Any]) -> str:
    return str(tokenizer.decode([m for m in out["masks"] if m != -100]))


def test_last_turn_only_trains_the_final_answer(tokenizer: Any) -> None:
    out = tokenize_for_trainer(tokenizer, CHAT, include_messages=True)
    assert len(out["tokens"]) == len(out["masks"])
    assert trained_text(tokenizer, out).startswith("6")
    assert "4" not in trained_text(tokenizer, out)
    assert out["messages"] == CHAT


def test_all_assistant_turns_are_trained_and_users_are_masked(tokenizer: Any) -> None:
    out = tokenize_for_trainer(tokenizer, CHAT, train_on_all_assistant_turns=True)
    text = trained_text(tokenizer, out)
    assert "4" in text and "6" in text and "2+2" not in text and "Be brief" not in text


def test_a_length_cut_completion_loses_the_template_eos(tokenizer: Any) -> None:
    chat = CHAT[:3]
    full = tokenize_for_trainer(tokenizer, chat)
    cut = tokenize_for_trainer(tokenizer, chat, finish_reason="length")
    if full["tokens"][-1] == tokenizer.eos_token_id:
        assert cut["tokens"] == full["tokens"][:-1]
    else:
        assert cut["tokens"] == full["tokens"]
    assert "messages" not in cut


async def test_managed_mode_tracks_tokens_masks_and_logprobs_across_turns(
    fake: Process, tokenizer: Any
) -> None:
    server = APIServerConfig(base_url=f"{fake.url}/v1", server_type="sglang", model_name="m")
    manager = ServerManager([server])
    messages = [{"role": "user", "content": "Hi"}]
    try:
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            first = await managed.chat_completion(messages=messages, n=2, max_tokens=8)
            [node_a, node_b] = managed.get_state()["nodes"]
            prompt = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
            assert node_a.tokens[: len(prompt_ids)] == prompt_ids
            assert (
                node_a.masked_tokens == [-100] * len(prompt_ids) + node_a.tokens[len(prompt_ids) :]
            )
            assert node_a.logprobs[: len(prompt_ids)] == [1.0] * len(prompt_ids)
            assert node_a.logprobs[len(prompt_ids) :] == pytest.approx([-0.5, -0.6, -0.7])
            assert node_a.tokens[len(prompt_ids)] == 100 and node_b.tokens[len(prompt_ids)] == 101
            assert len(first.choices) == 2

            turn_two = [
                *messages,
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Again"},
            ]
            rendered = tokenizer.apply_chat_template(
                turn_two, tokenize=False, add_generation_prompt=True
            )
            if not rendered.startswith(node_a.full_text):
                pytest.fail("the fake's output does not render back into the template")
            await managed.chat_completion(messages=turn_two, n=1)
            nodes = managed.get_state()["nodes"]
            assert len(nodes) == 2, "node a was extended in place; node b is kept"
            extended, kept = nodes
            assert kept == node_b
            assert extended.tokens[: len(node_a.tokens)] == node_a.tokens, "no re-tokenization"
            assert extended.masked_tokens[: len(node_a.tokens)] == node_a.masked_tokens
            new_prompt = len(extended.tokens) - len(node_a.tokens) - 3
            assert (
                extended.masked_tokens[len(node_a.tokens) : len(node_a.tokens) + new_prompt]
                == [-100] * new_prompt
            )
        assert managed.get_state()["nodes"] == []
    finally:
        await manager.close()


async def test_managed_mode_on_an_openai_server_says_what_to_change(
    fake: Process, tokenizer: Any
) -> None:
    manager = ServerManager([APIServerConfig(base_url=f"{fake.url}/v1")])
    try:
        with pytest.raises(ConfigError, match="server_type to vllm, sglang or embedded"):
            async with manager.managed_server(tokenizer=tokenizer):
                pass
        with pytest.raises(NotImplementedError, match="ATROPOS_ALLOW_DUMMY_MANAGED_SERVER"):
            async with manager.managed_server(tokenizer=tokenizer):
                pass
    finally:
        await manager.close()


async def test_atropos_dummy_switch_gives_real_text_with_placeholder_tokens(
    fake: Process, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "1")
    manager = ServerManager([APIServerConfig(base_url=f"{fake.url}/v1")])
    try:
        with pytest.warns(UserWarning, match="placeholder"):
            async with manager.managed_server(tokenizer=tokenizer) as managed:
                reply = await managed.chat_completion(
                    messages=[{"role": "user", "content": "hi"}], n=2
                )
                nodes = managed.get_state()["nodes"]
        assert len(reply.choices) == 2 and len(nodes) == 2
        assert nodes[0].tokens == list(range(128)) and nodes[0].masked_tokens[0] == -100
        assert nodes[0].metadata == {"finish_reason": "stop", "dummy_tokens": True}
        assert nodes[0].full_text.endswith(f"assistant:{reply.choices[0].message.content}")
    finally:
        await manager.close()


def test_vllm_choices_with_token_ids_and_logprobs() -> None:
    choice = {
        "index": 0,
        "text": "ab",
        "finish_reason": "length",
        "logprobs": {"tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.1, -0.2]},
    }
    parsed = parse_vllm_choice(choice)
    assert parsed.output_ids == [5, 9] and parsed.logprobs == [-0.1, -0.2]
    assert parsed.finish_reason == "length"
    with pytest.raises(InferenceError, match="malformed"):
        parse_vllm_choice({"logprobs": None})


class AtroposStyleEnv(BaseEnv):
    """The shape of Atropos 0.4's gsm8k env: its own __init__, buffers, managed mode."""

    name = "gsm8k_like"

    def __init__(self, config, server_configs, slurm=True, testing=False):  # type: ignore[no-untyped-def]
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = list()
        self.rollouts_for_wandb = []
        self.completion_lengths = []
        self.iter = 0

    async def setup(self):  # type: ignore[no-untyped-def]
        self.train = [{"question": "What is 2+2?", "answer": "4"}]

    async def get_next_item(self):  # type: ignore[no-untyped-def]
        self.iter += 1
        return self.train[0]

    def save_checkpoint(self, step, data=None):  # type: ignore[no-untyped-def]
        data = data or {}
        data["iter"] = self.iter
        super().save_checkpoint(step, data)

    async def wandb_log(self, wandb_metrics=None):  # type: ignore[no-untyped-def]
        wandb_metrics = wandb_metrics or {}
        wandb_metrics["train/percent_correct"] = 0.5
        await super().wandb_log(wandb_metrics)

    async def collect_trajectories(self, item):  # type: ignore[no-untyped-def]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=[{"role": "user", "content": item["question"]}],
                n=self.config.group_size,
                max_tokens=16,
            )
            nodes = managed.get_state()["nodes"]
        scores = ScoredDataGroup()
        scores["tokens"], scores["masks"], scores["scores"] = [], [], []
        scores["inference_logprobs"] = []
        for index, (choice, node) in enumerate(zip(completion.choices, nodes, strict=True)):
            scores["tokens"].append(node.tokens)
            scores["masks"].append(node.masked_tokens)
            scores["inference_logprobs"].append(node.logprobs)
            scores["scores"].append(1.0 if index == 0 else -1.0)
            self.percent_correct_buffer.append(index == 0)
            assert choice.finish_reason == "stop"
        return scores, []

    async def evaluate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return None


async def test_an_atropos_style_env_with_managed_mode_produces_aligned_groups(
    fake: Process, tokenizer: Any, tmp_path: Path
) -> None:
    config = BaseEnvConfig(tokenizer_name=tokenizer_path(), group_size=3, use_wandb=False)
    server = APIServerConfig(base_url=f"{fake.url}/v1", server_type="sglang", model_name="m")
    env = AtroposStyleEnv(config, [server], slurm=False)
    env.tokenizer = tokenizer
    await env.setup()
    [group] = await env.run_item(await env.get_next_item())
    assert group["scores"] == [1.0, -1.0, -1.0]
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        trained = [i for i, m in enumerate(masks) if m != -100]
        assert [logprobs[i] for i in trained] == pytest.approx([-0.5, -0.6, -0.7])
        assert all(logprobs[i] == 1.0 for i in range(len(tokens)) if i not in trained)
    assert env.completion_lengths == [3, 3, 3]
    env.checkpoint_dir, env.wandb_prepend = str(tmp_path), "gsm8k_like_0"
    env.save_checkpoint(5)
    env.iter, env.curr_step = 0, 5
    env.load_checkpoint()
    assert env.iter == 1
    await env.wandb_log()
    assert env.completion_lengths == [] and env.rollouts_for_wandb == []
    await env.server.close()


async def test_vllm_managed_mode_sends_token_ids_and_reads_token_logprobs(
    fake: Process, tokenizer: Any
) -> None:
    server = APIServerConfig(base_url=f"{fake.url}/v1", server_type="vllm", model_name="m")
    manager = ServerManager([server], max_n_completions=2)
    try:
        async with manager.managed_server(tokenizer=tokenizer) as managed:
            answer = await managed.completion(prompt="Count: 1 2 3", n=3, max_tokens=4)
            nodes = managed.get_state()["nodes"]
        prompt_ids = tokenizer.encode("Count: 1 2 3", add_special_tokens=False)
        assert len(answer.choices) == 3 and len(nodes) == 3
        assert [node.tokens[len(prompt_ids)] for node in nodes] == [300, 301, 300]
        assert nodes[0].logprobs[len(prompt_ids) :] == [-0.25, -0.5, -0.75]
        assert nodes[0].masked_tokens[: len(prompt_ids)] == [-100] * len(prompt_ids)
    finally:
        await manager.close()
