"""server_type trl: requests to a fake ``trl vllm-serve`` (pre-1.0 API) on a real uvicorn port."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, HTTPException
from transformers import AutoTokenizer

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.trl_vllm_server import TrlVllmServer
from atroposlib.errors import InferenceError, InferenceRejectedError, InferenceUnavailableError
from tests.fakes import free_port

CHAT = [{"role": "user", "content": "Name a colour."}]


class FakeTrl:
    """``POST /generate/``: the first completion of each prompt ends with EOS, the others run
    to ``max_tokens``; ``mode`` makes it misbehave. Every request body is kept."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.bodies: list[dict[str, Any]] = []
        self.mode = "ok"
        self.app = FastAPI()
        self.app.post("/generate/")(self.generate)
        self.app.get("/health/")(self.health)

    async def generate(self, body: dict[str, Any]) -> Any:
        self.bodies.append(body)
        if self.mode == "reject":
            raise HTTPException(422, "prompts: field required")
        if self.mode == "garbage":
            return {"completion_ids": [["not", "ids"]]}
        finished = self.tokenizer.encode("Blue. END here", add_special_tokens=False)
        endless = self.tokenizer.encode(" red" * 50, add_special_tokens=False)
        out = []
        for _ in body["prompts"]:
            out.append([*finished, self.tokenizer.eos_token_id])
            out.extend(endless[: body["max_tokens"]] for _ in range(body.get("n", 1) - 1))
        return {"completion_ids": out}

    async def health(self) -> dict[str, str]:
        if self.mode == "down":
            raise HTTPException(503, "loading")
        return {"status": "ok"}


@pytest.fixture(scope="module")
def tokenizer(test_model_path: Path) -> Any:
    return AutoTokenizer.from_pretrained(test_model_path)


@pytest.fixture(scope="module")
def trl(tokenizer: Any) -> Iterator[tuple[FakeTrl, str]]:
    fake = FakeTrl(tokenizer)
    server = uvicorn.Server(
        uvicorn.Config(fake.app, host="127.0.0.1", port=free_port(), log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield fake, f"http://127.0.0.1:{server.config.port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def fake(trl: tuple[FakeTrl, str]) -> FakeTrl:
    trl[0].bodies.clear()
    trl[0].mode = "ok"
    return trl[0]


def manager(url: str, model: Path, **extra: Any) -> ServerManager:
    config = APIServerConfig(server_type="trl", base_url=f"{url}/v1", model_name=str(model),
                             max_retries=1, retry_backoff_s=0.01, **extra)  # fmt: skip
    return ServerManager([config])


async def test_a_chat_is_rendered_sent_and_decoded(
    fake: FakeTrl, trl: tuple[FakeTrl, str], test_model_path: Path, tokenizer: Any
) -> None:
    servers = manager(trl[1], test_model_path)
    assert isinstance(servers.servers[0], TrlVllmServer)
    try:
        answer = await servers.chat_completion(messages=CHAT, n=2, temperature=0.7, max_tokens=6)
    finally:
        await servers.close()
    expected_prompt = tokenizer.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )
    assert fake.bodies == [
        {"prompts": [expected_prompt], "max_tokens": 6, "n": 2, "temperature": 0.7}
    ]
    first, second = answer.choices
    assert (first.message.content, first.finish_reason) == ("Blue. END here", "stop")
    assert second.message.content == " red" * 6 and second.finish_reason == "length"
    assert answer.model == str(test_model_path) and answer.object == "chat.completion"


async def test_completion_applies_stop_strings_and_warns_about_what_trl_lacks(
    fake: FakeTrl, trl: tuple[FakeTrl, str], test_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    servers = manager(trl[1], test_model_path)
    try:
        with caplog.at_level(logging.WARNING):
            answer = await servers.completion(prompt="Colours:", stop=[" END"], seed=3, top_k=5)
            await servers.completion(prompt="Colours:", seed=4)
    finally:
        await servers.close()
    assert [body["prompts"] for body in fake.bodies] == [["Colours:"]] * 2
    assert fake.bodies[0]["top_k"] == 5 and fake.bodies[0]["max_tokens"] == 1024
    assert (answer.choices[0].text, answer.choices[0].finish_reason) == ("Blue.", "stop")
    assert caplog.text.count("server_type trl: seed not supported by trl vllm-serve") == 1


async def test_bad_answers_are_inference_errors(
    fake: FakeTrl, trl: tuple[FakeTrl, str], test_model_path: Path
) -> None:
    servers = manager(trl[1], test_model_path)
    try:
        fake.mode = "reject"
        with pytest.raises(InferenceRejectedError, match=r"HTTP 422: .*prompts: field required"):
            await servers.completion(prompt="x")
        assert len(fake.bodies) == 1, "a rejected request is not retried"
        fake.mode = "garbage"
        with pytest.raises(InferenceUnavailableError, match="expected 1 completion_ids lists"):
            await servers.completion(prompt="x")
        assert len(fake.bodies) == 3, "a malformed answer is retried"
        with pytest.raises(InferenceError, match="cannot return token ids"):
            await servers.servers[0].generate([1, 2], 1, {})
    finally:
        await servers.close()


async def test_health_check_and_an_unreachable_server(
    fake: FakeTrl, trl: tuple[FakeTrl, str], test_model_path: Path
) -> None:
    servers = manager(trl[1], test_model_path)
    dead = manager(f"http://127.0.0.1:{free_port()}", test_model_path, timeout=2)
    try:
        assert await servers.servers[0].health_check()
        fake.mode = "down"
        assert not await servers.servers[0].health_check()
        assert not await dead.servers[0].health_check()
        with pytest.raises(InferenceUnavailableError, match="ClientConnectorError"):
            await dead.completion(prompt="x")
    finally:
        await servers.close()
        await dead.close()
