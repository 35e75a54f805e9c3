"""The embedded inference server end to end: a real process, the real model, real HTTP."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import httpx
import pytest
import torch
from inference_helpers import SERVED_NAME, RunningServer

from atroposlib.wire.engine import GenerateResponse
from atroposlib.wire.openai import ChatCompletionResponse, CompletionResponse

pytestmark = [pytest.mark.model, pytest.mark.slow]


def chat(
    client: httpx.Client, question: str | list[dict[str, str]], **extra: Any
) -> ChatCompletionResponse:
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": question}], **extra}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return ChatCompletionResponse.model_validate(response.json())


def generate(client: httpx.Client, body: dict[str, Any]) -> Any:
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def chat_ids(reference: Any, question: str) -> list[int]:
    _, tokenizer = reference
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def true_logprobs(
    reference: Any, prompt: list[int], output: list[int], temperature: float, top_p: float = 1.0
) -> torch.Tensor:
    """log p(output_t | prefix) under log_softmax(logits / T), nucleus-renormalised."""
    model, _ = reference
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    if top_p < 1:
        for row in log_probs:
            ordered, _ = torch.sort(row, descending=True)
            before = torch.cumsum(ordered.exp(), 0) - ordered.exp()
            nucleus = ordered[before < top_p]
            threshold = nucleus[-1]
            kept = row[row >= threshold]
            row -= torch.logsumexp(kept, 0)
    return log_probs.gather(-1, torch.tensor(output)[:, None])[:, 0]


def test_health_and_models(client: httpx.Client) -> None:
    health = client.get("/health").json()
    assert {k: health[k] for k in ("status", "model", "weight_version")} == {
        "status": "ok",
        "model": SERVED_NAME,
        "weight_version": 0,
    }
    assert health["sequences_running"] == health["sequences_waiting"] == 0
    models = client.get("/v1/models").json()
    assert [card["id"] for card in models["data"]] == [SERVED_NAME]
    assert models["data"][0]["max_model_len"] == 8192


def test_greedy_arithmetic_answers_five(client: httpx.Client) -> None:
    parts = [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+3?"}]
    answer = chat(client, parts, temperature=0, max_tokens=30)
    choice = answer.choices[0]
    assert "5" in choice.message.content
    assert choice.finish_reason == "stop"
    assert answer.usage.completion_tokens == len(choice.token_ids or [])
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_n_choices_and_prompt_major_order(client: httpx.Client) -> None:
    answer = chat(client, "Name a colour.", n=4, temperature=1.0, max_tokens=8, seed=11)
    assert [c.index for c in answer.choices] == [0, 1, 2, 3]
    body = {
        "model": SERVED_NAME,
        "prompt": ["The capital of France is", "One, two, three,"],
        "n": 2,
        "max_tokens": 4,
        "temperature": 0,
    }
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    texts = [c.text for c in CompletionResponse.model_validate(response.json()).choices]
    assert len(texts) == 4
    assert texts[0] == texts[1] and texts[2] == texts[3]
    assert "Paris" in texts[0] and "four" in texts[2].lower()


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.6, 1.0), (1.3, 0.9)])
def test_logprobs_are_the_models_true_logprobs(
    client: httpx.Client, reference: Any, temperature: float, top_p: float
) -> None:
    prompt = chat_ids(reference, "Tell me a fact about cats.")
    params = {"max_new_tokens": 12, "temperature": temperature, "top_p": top_p, "seed": 5}
    answer = generate(
        client, {"input_ids": prompt, "sampling_params": params, "return_logprob": True}
    )
    pairs = answer["meta_info"]["output_token_logprobs"]
    assert [token for _, token, _ in pairs] == answer["output_ids"]
    served = torch.tensor([logprob for logprob, _, _ in pairs])
    expected = true_logprobs(reference, prompt, answer["output_ids"], temperature, top_p)
    assert torch.allclose(served, expected, atol=1e-3), (served - expected).abs().max()


def test_chat_and_completion_logprobs_agree_with_tokens(client: httpx.Client) -> None:
    answer = chat(client, "Say hi.", max_tokens=6, logprobs=True, top_logprobs=3, seed=1)
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    assert len(content) == len(answer.choices[0].token_ids or [])
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6
    body = {"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 5, "logprobs": 2, "seed": 2}
    completion = CompletionResponse.model_validate(client.post("/v1/completions", json=body).json())
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and len(logprobs.tokens) == 5
    assert "".join(logprobs.tokens).startswith(completion.choices[0].text)
    assert all(len(top) == 2 for top in logprobs.top_logprobs or [])


def test_token_endpoint_round_trips_ids(client: httpx.Client, reference: Any) -> None:
    _, tokenizer = reference
    prompt = tokenizer.encode("The capital of France is")
    single = generate(
        client,
        {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6, "temperature": 0}},
    )
    parsed = GenerateResponse.model_validate(single)
    assert parsed.meta_info.prompt_tokens == len(prompt)
    assert parsed.meta_info.completion_tokens == len(parsed.output_ids) == 6
    assert parsed.meta_info.finish_reason.type == "length"
    assert tokenizer.decode(parsed.output_ids) == parsed.text
    # the same ids through the OpenAI endpoint give the same tokens
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 6, "temperature": 0}
    completion = client.post("/v1/completions", json=body).json()
    assert completion["choices"][0]["token_ids"] == parsed.output_ids
    # continuing from prompt + output reproduces the greedy continuation's tail
    longer = generate(
        client,
        {"input_ids": prompt, "sampling_params": {"max_new_tokens": 9, "temperature": 0}},
    )
    resumed = generate(
        client,
        {
            "input_ids": prompt + parsed.output_ids,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0},
        },
    )
    assert parsed.output_ids + resumed["output_ids"] == longer["output_ids"]
    batch = generate(
        client,
        {
            "input_ids": [prompt, tokenizer.encode("1, 2, 3,")],
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "n": 2},
            "return_logprob": True,
        },
    )
    assert isinstance(batch, list) and len(batch) == 4
    assert batch[0]["output_ids"] == batch[1]["output_ids"] == parsed.output_ids[:4]
    assert [b["meta_info"]["prompt_tokens"] for b in batch] == [len(prompt)] * 2 + [
        len(tokenizer.encode("1, 2, 3,"))
    ] * 2


def test_stop_strings_are_honoured(client: httpx.Client, reference: Any) -> None:
    answer = chat(client, "What is 2+3?", temperature=0, max_tokens=30, stop=["="])
    assert answer.choices[0].message.content == "2 + 3 "
    assert answer.choices[0].finish_reason == "stop"
    body = {
        "input_ids": chat_ids(reference, "What is 2+3?"),
        "sampling_params": {"max_new_tokens": 30, "temperature": 0, "stop": ["3 ="]},
    }
    result = generate(client, body)
    assert result["text"] == "2 + "
    assert result["meta_info"]["finish_reason"] == {
        "type": "stop",
        "matched": "3 =",
        "length": None,
    }
    eos = generate(client, {**body, "sampling_params": {"max_new_tokens": 30, "temperature": 0}})
    assert eos["meta_info"]["finish_reason"]["matched"] == 2
    assert eos["output_ids"][-1] == 2 and eos["text"] == "2 + 3 = 5"


def test_stop_takes_token_ids_as_atropos_envs_send_them(
    client: httpx.Client, reference: Any
) -> None:
    """Atropos environments pass ``stop=[tokenizer.eos_token_id]``; the ``=`` token (446)
    and a string may come in the same list."""
    prompt = chat_ids(reference, "What is 2+3?")
    params = {"max_new_tokens": 30, "temperature": 0, "ignore_eos": True}
    by_id = generate(client, {"input_ids": prompt, "sampling_params": {**params, "stop": [446]}})
    assert by_id["output_ids"][-1] == 446 and by_id["text"] == "2 + 3 ="
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": 446, "length": None}
    mixed = {**params, "stop": ["+", 446]}
    assert generate(client, {"input_ids": prompt, "sampling_params": mixed})["text"] == "2 "
    answer = chat(client, "What is 2+3?", temperature=0, max_tokens=30, stop=[2])
    assert answer.choices[0].finish_reason == "stop"
    assert (answer.choices[0].token_ids or [])[-1] == 2
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 30, "temperature": 0}
    completion = client.post("/v1/completions", json={**body, "stop": 446, "ignore_eos": True})
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["text"] == "2 + 3 ="


def test_concurrent_clients_get_their_own_answers(client: httpx.Client, reference: Any) -> None:
    questions = [f"What is {a}+{b}?" for a, b in [(2, 3), (1, 1), (4, 5), (10, 7)]]
    questions += ["Name a fruit.", "What colour is the sky?", "Count to five.", "Say hello."]
    bodies = [
        {
            "input_ids": chat_ids(reference, q),
            "sampling_params": {"max_new_tokens": 8 + 2 * i, "temperature": 0},
        }
        for i, q in enumerate(questions)
    ]
    alone = [generate(client, body)["output_ids"] for body in bodies[:3]]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(lambda body: generate(client, body), bodies))
    assert [t["output_ids"] for t in together[:3]] == alone
    for body, answer in zip(bodies, together, strict=True):
        limit = body["sampling_params"]["max_new_tokens"]
        assert 0 < answer["meta_info"]["completion_tokens"] <= limit
    assert "5" in together[0]["text"]


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/v1/completions", {"model": "nope", "prompt": "hi"}, 404, "model"),
        (
            "/v1/completions",
            {"model": SERVED_NAME, "prompt": "hi", "max_tokens": 9000},
            400,
            "max_tokens",
        ),
        ("/v1/completions", {"model": SERVED_NAME, "prompt": "hi", "n": 0}, 422, "n"),
        (
            "/v1/completions",
            {"model": SERVED_NAME, "prompt": "hi", "temperature": -0.5},
            422,
            "temperature",
        ),
        ("/v1/completions", {"model": SERVED_NAME, "prompt": [1, 99999999]}, 422, "prompt"),
        ("/v1/completions", {"model": SERVED_NAME, "prompt": "hi", "seed": 2**64}, 422, "seed"),
        (
            "/v1/completions",
            f'{{"model": "{SERVED_NAME}", "prompt": "hi", "top_p": NaN}}',  # Python's json reads it
            422,
            "top_p",
        ),
        (
            "/generate",
            '{"input_ids": [1], "sampling_params": {"temperature": Infinity}}',
            422,
            "temperature",
        ),
        (
            "/v1/completions",
            {"model": SERVED_NAME, "prompt": "hi", "max_tokens": 2**40},
            422,
            "max_tokens",
        ),
        ("/v1/completions", {"model": SERVED_NAME, "prompt": "hi", "stop": [2**40]}, 422, "stop"),
        ("/v1/completions", {"model": SERVED_NAME, "prompt": "hi", "stop": [60000]}, 422, "stop"),
        (
            "/v1/completions",
            {"model": SERVED_NAME, "prompt": "hi", "stop_token_ids": [-1]},
            422,
            "stop_token_ids",
        ),
        (
            "/v1/completions",
            {"model": SERVED_NAME, "prompt": ["a"] * 33, "n": 128},
            413,
            "prompt, n",
        ),
        (
            "/v1/completions",
            {"model": SERVED_NAME, "prompt": ["a", "b"], "n": 128, "max_tokens": 8000},
            413,
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            {"model": SERVED_NAME, "messages": [{"role": "wizard", "content": "x"}]},
            422,
            "role",
        ),
        ("/v1/chat/completions", {"model": SERVED_NAME, "messages": []}, 422, "messages"),
        (
            "/v1/chat/completions",
            {
                "model": SERVED_NAME,
                "messages": [{"role": "user", "content": [{"type": "image_url"}]}],
            },
            400,
            "messages[0].content",
        ),
        (
            "/generate",
            {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 8192}},
            400,
            "max_new_tokens",
        ),
        ("/generate", {"input_ids": [1, 2], "sampling_params": {"n": 0}}, 422, "n"),
        (
            "/generate",
            {"input_ids": [1, 2], "sampling_params": {"stop": [49152]}},
            422,
            "sampling_params.stop",
        ),
        (
            "/generate",
            {"input_ids": [1, 2], "sampling_params": {"sampling_seed": -(2**70)}},
            422,
            "sampling_seed",
        ),
        ("/generate", {"sampling_params": {}}, 422, "input_ids"),
        ("/update_weights_from_disk", {}, 422, "model_path"),
    ],
)
def test_bad_requests_get_4xx_naming_the_field(
    client: httpx.Client, path: str, body: dict[str, Any] | str, status: int, field: str
) -> None:
    if isinstance(body, str):
        headers = {"content-type": "application/json"}
        response = client.post(path, content=body.encode(), headers=headers)
    else:
        response = client.post(path, json=body)
    assert response.status_code == status, response.text
    assert field in str(response.json()["detail"])


def test_requests_leave_no_access_log_lines_at_info(
    client: httpx.Client, server: RunningServer
) -> None:
    """A demo sends ~600 requests; at the default log level none is a log line of its own."""
    answer = client.post(
        "/v1/completions", json={"model": server.name, "prompt": "Hi", "max_tokens": 2}
    )
    assert answer.status_code == 200
    assert server.log_path is not None
    log = server.log_path.read_text()
    assert "Uvicorn running" in log or "Application startup complete" in log
    assert "POST /v1/completions" not in log
