"""``example_trainer/vllm_api_server.py``: Atropos's ``/generate`` over a vLLM engine.

Unit tests: a fake engine (the shape of vLLM's ``RequestOutput``) and a recording stand-in for
``SamplingParams``, so they run without vLLM. ``tests/trainer/test_vllm_api_server_real.py``
starts the server on a real vLLM (the ``vllm`` tier).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from example_trainer import vllm_api_server as server
from tests.fakes import uvicorn_on_loopback

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    logprobs: list[dict[int, Logprob]] | None = None


@dataclass
class RequestOutput:
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[Completion]
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


@dataclass
class FakeEngine:
    """Answers every request with ``answer``; keeps what it was asked."""

    answer: RequestOutput
    fail_with: Exception | None = None
    asked: list[tuple[Any, dict[str, Any]]] = field(default_factory=list)

    class tokenizer:  # vLLM's engine exposes its tokenizer as an attribute
        @staticmethod
        def decode(ids: list[int]) -> str:
            return " ".join(f"<{i}>" for i in ids)

    async def _outputs(self) -> AsyncIterator[RequestOutput]:
        if self.fail_with is not None:
            raise self.fail_with
        yield self.answer

    def generate(self, prompt: Any, params: dict[str, Any], request_id: str) -> Any:
        self.asked.append((prompt, params))
        return self._outputs()


class EngineDeadError(RuntimeError):
    """Named as vLLM's, whose name the clients look for."""


class VLLMClientError(Exception):
    """vLLM's base of the errors a request causes (not a ValueError), by name."""


class GracefulHTTPError(Exception):
    """vLLM's error that carries its own status (a full request queue: 503)."""

    http_status = 503


def sampling_params(**fields: Any) -> dict[str, Any]:
    if "bogus" in fields:
        raise TypeError("Unexpected keyword argument 'bogus'")
    if fields.get("top_p", 1.0) > 1.0:
        raise VLLMClientError(f"top_p must be in (0, 1], got {fields['top_p']}.")
    if fields.get("min_p", 0.0) > 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {fields['min_p']}.")
    return fields


ANSWER = RequestOutput(
    prompt=None,
    prompt_token_ids=[5, 6, 7],
    outputs=[
        Completion(" world", [11, 12], "stop", [{11: Logprob(-0.3)}, {13: Logprob(-0.1),
                                                                     12: Logprob(-0.9)}]),
        Completion(" there", [14, 2], "length", [{14: Logprob(-0.5)}, {2: Logprob(-0.25)}]),
    ],
    prompt_logprobs=[None, {6: Logprob(-2.0), 9: Logprob(-1.0)}, {7: Logprob(-0.5)}],
)  # fmt: skip


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    fake = FakeEngine(ANSWER)
    monkeypatch.setattr(server, "engine", fake)
    monkeypatch.setattr(server, "make_sampling_params", sampling_params)
    monkeypatch.setattr(server, "drop_seed", False)
    monkeypatch.setattr(server, "_seed_warned", False)
    return fake


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(server.app) as http:
        yield http


def test_token_ids_in_atropos_shape_out(client: TestClient, engine: FakeEngine) -> None:
    body = {"prompt": {"prompt_token_ids": [5, 6, 7]}, "logprobs": 1, "n": 2, "max_tokens": 2,
            "temperature": 1.0, "top_k": 20, "stop": ["\n"]}  # fmt: skip
    answer = client.post("/generate", json=body)
    assert answer.status_code == 200, answer.text
    [(prompt, params)] = engine.asked
    assert prompt == {"prompt_token_ids": [5, 6, 7]}
    assert params == {"n": 2, "max_tokens": 2, "temperature": 1.0, "logprobs": 1, "top_k": 20,
                      "stop": ["\n"]}  # fmt: skip
    assert answer.json() == {
        "text": [" world", " there"],
        "prompt": "<5> <6> <7>",  # the engine had no prompt text: decoded from the ids
        "finish_reasons": ["stop", "length"],
        "token_ids": [[11, 12], [14, 2]],
        "prompt_token_ids": [5, 6, 7],
        # one [{token: logprob, ...}] per position, the sampled token first (12 before 13)
        "logprobs": [[[{"11": -0.3}], [{"12": -0.9, "13": -0.1}]],
                     [[{"14": -0.5}], [{"2": -0.25}]]],
    }  # fmt: skip


def test_a_text_prompt_or_a_bare_id_list_reaches_the_engine_as_vllm_takes_it(
    client: TestClient, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine.answer, "prompt", "hello")
    first = client.post("/generate", json={"prompt": "hello", "max_tokens": 1})
    client.post("/generate", json={"prompt": [5, 6, 7]})
    assert [prompt for prompt, _ in engine.asked] == ["hello", {"prompt_token_ids": [5, 6, 7]}]
    body = first.json()
    assert body["prompt"] == "hello" and "logprobs" not in body and "prompt_logprobs" not in body


def test_prompt_logprobs_have_none_for_the_first_token(client: TestClient) -> None:
    body = client.post("/generate", json={"prompt": [5, 6, 7], "prompt_logprobs": 1}).json()
    assert body["prompt_logprobs"] == [None, [{"6": -2.0, "9": -1.0}], [{"7": -0.5}]]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"max_tokens": 4}, "prompt: Field required"),
        ({"prompt": []}, "prompt"),
        ({"prompt": {"prompt_token_ids": []}}, "prompt.TokenPrompt.prompt_token_ids"),
        ({"prompt": {"ids": [1]}}, "prompt"),
        ({"prompt": "x", "temperature": -1}, "temperature: Input should be greater than or"),
        ({"prompt": "x", "n": 0}, "n: Input should be greater than or equal to 1"),
        ({"prompt": "x", "logprobs": "two"}, "logprobs: Input should be a valid integer"),
        ({"prompt": "x", "stream": True}, "stream: not offered"),
        ({"prompt": "x", "bogus": 1}, "unknown sampling field (Unexpected keyword argument"),
        ({"prompt": "x", "top_p": 2.0}, "top_p must be in (0, 1], got 2.0."),
        ({"prompt": "x", "min_p": 2.0}, "min_p must be in [0, 1], got 2.0."),
    ],
)  # fmt: skip
def test_bad_input_is_a_422_naming_the_field(
    client: TestClient, engine: FakeEngine, body: dict[str, Any], named: str
) -> None:
    answer = client.post("/generate", json=body)
    assert answer.status_code == 422, answer.text
    assert named in answer.json()["detail"]
    assert engine.asked == []


@pytest.mark.parametrize(
    ("refusal", "status"),
    [(VLLMClientError("The decoder prompt (length 9000) is longer than 2048"), 422),
     (ValueError("The decoder prompt (length 9000) is longer than 2048"), 422),
     (GracefulHTTPError("The decoder prompt (length 9000) is longer than 2048"), 503)],
)  # fmt: skip
def test_a_request_the_engine_refuses_keeps_its_reason(
    client: TestClient, engine: FakeEngine, refusal: Exception, status: int
) -> None:
    engine.fail_with = refusal
    answer = client.post("/generate", json={"prompt": [1] * 9000})
    assert answer.status_code == status
    assert answer.json()["detail"] == "The decoder prompt (length 9000) is longer than 2048"


def test_a_dead_engine_is_a_500_naming_it(client: TestClient, engine: FakeEngine) -> None:
    engine.fail_with = EngineDeadError("EngineCore encountered an issue.")
    answer = client.post("/generate", json={"prompt": "x"})
    assert answer.status_code == 500
    assert answer.json()["detail"] == "EngineDeadError: EngineCore encountered an issue."


def test_seed_is_dropped_only_where_a_chunked_prefill_would_kill_the_engine(
    client: TestClient, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    client.post("/generate", json={"prompt": "x", "seed": 7})
    monkeypatch.setattr(server, "drop_seed", True)
    for _ in range(2):
        assert client.post("/generate", json={"prompt": "x", "seed": 7}).status_code == 200
    assert [params.get("seed") for _, params in engine.asked] == [7, None, None]
    assert sum("seed dropped" in r.getMessage() for r in caplog.records) == 1


def test_health_and_a_server_whose_engine_has_not_started(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert client.get("/health").status_code == 200
    monkeypatch.setattr(server, "engine", None)
    assert client.get("/health").status_code == 503
    answer = client.post("/generate", json={"prompt": "x"})
    assert answer.status_code == 503 and answer.json() == {"detail": "engine not started yet"}


def test_health_reports_a_dead_engine(client: TestClient, engine: FakeEngine) -> None:
    async def check_health() -> None:
        raise EngineDeadError("EngineCore encountered an issue.")

    engine.check_health = check_health  # type: ignore[attr-defined]
    answer = client.get("/health")
    assert answer.status_code == 500 and "EngineDeadError" in answer.json()["detail"]


# ---- keys: the guard our vLLM servers mount, on a real uvicorn --------------------------

RUN, ADMIN = {"authorization": "Bearer run-key"}, {"authorization": "Bearer admin-key"}
BODY = {"prompt": [5, 6, 7], "max_tokens": 2}


def test_the_run_key_generates_and_nothing_reaches_the_engine_without_it(
    engine: FakeEngine,
) -> None:
    keys = {"ATROPOS_API_KEY": "run-key", "ATROPOS_ADMIN_API_KEY": "admin-key"}
    with uvicorn_on_loopback(server.guarded(keys)) as url:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "run-key"}):
            refused = httpx.post(f"{url}/generate", json=BODY, headers=headers)
            assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        for path in ("/openapi.json", "/docs"):  # everything but sampling is the admin's
            assert httpx.get(url + path, headers=RUN).status_code == 401
        assert engine.asked == []  # nothing was generated for a refused request
        assert httpx.get(f"{url}/health").status_code == 200
        for headers in (RUN, ADMIN):
            assert httpx.post(f"{url}/generate", json=BODY, headers=headers).status_code == 200
        assert len(engine.asked) == 2


def test_an_admin_key_alone_leaves_generate_closed_to_every_other_key(engine: FakeEngine) -> None:
    with uvicorn_on_loopback(server.guarded({"ATROPOS_ADMIN_API_KEY": "admin-key"})) as url:
        for headers in ({}, RUN):
            assert httpx.post(f"{url}/generate", json=BODY, headers=headers).status_code == 401
        assert engine.asked == []
        assert httpx.post(f"{url}/generate", json=BODY, headers=ADMIN).status_code == 200


def test_without_a_key_it_serves_loopback_only_and_refuses_browsers(engine: FakeEngine) -> None:
    with uvicorn_on_loopback(server.guarded({})) as url:
        foreign = {"origin": "https://evil.example", "sec-fetch-site": "cross-site"}
        assert httpx.post(f"{url}/generate", json=BODY, headers=foreign).status_code == 403
        assert engine.asked == []
        assert httpx.post(f"{url}/generate", json=BODY).status_code == 200


@pytest.mark.parametrize(
    ("argv", "environ", "refused"),
    [
        ([], {}, None),  # loopback by default
        (["--host", "0.0.0.0"], {}, "ATROPOS_API_KEY is not set"),
        (["--host=10.1.2.3", "--port", "9"], {}, "ATROPOS_INSECURE_NO_KEY=1"),
        (["--host", "0.0.0.0"], {"ATROPOS_API_KEY": "k"}, None),
        (["--host", "0.0.0.0"], {"ATROPOS_ADMIN_API_KEY": "k"}, None),
        (["--host", "0.0.0.0"], {"ATROPOS_INSECURE_NO_KEY": "1"}, None),
        ([], {"ATROPOS_API_KEY": " "}, "set but empty"),
    ],
)
def test_a_network_bind_needs_a_key(
    argv: list[str], environ: dict[str, str], refused: str | None
) -> None:
    reason = server.bind_refusal(argv, environ)
    assert reason == refused if refused is None else refused in (reason or "")


def test_an_open_network_bind_stops_before_vllm_loads_with_one_line(
    subprocess_env: dict[str, str],
) -> None:
    env = {k: v for k, v in subprocess_env.items() if "API_KEY" not in k}
    done = subprocess.run(
        [sys.executable, str(REPO / "example_trainer" / "vllm_api_server.py"),
         "--model", "any", "--host", "0.0.0.0"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "vllm_api_server: error: --host 0.0.0.0 is reachable from other machines and "
        "ATROPOS_API_KEY is not set: export the run's key, bind 127.0.0.1, or set "
        "ATROPOS_INSECURE_NO_KEY=1 to serve it open"
    ]
