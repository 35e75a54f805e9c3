"""``POST /update_weights_from_disk`` on a real server: new weights, versions, no lost requests."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytestmark = [pytest.mark.model, pytest.mark.slow]

PROMPT = [504, 3575, 282, 4649, 314]  # "The capital of France is"
GREEDY = {"max_new_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def perturbed_checkpoint(test_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test model with noise on every weight, saved as a transformers folder."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(test_model_path, dtype="float32")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.add_(noise * parameter.std() * 0.3)
    folder = tmp_path_factory.mktemp("perturbed")
    model.save_pretrained(folder)
    return folder


def greedy(client: httpx.Client, max_new_tokens: int = 8) -> dict[str, Any]:
    params = {**GREEDY, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    body = {"input_ids": PROMPT, "sampling_params": params}
    response = client.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def reload(client: httpx.Client, path: Path | str) -> httpx.Response:
    return client.post("/update_weights_from_disk", json={"model_path": str(path)})


def test_bad_path_keeps_the_old_weights(client: httpx.Client, tmp_path: Path) -> None:
    before = greedy(client)
    for path in ["/no/such/folder", tmp_path]:
        response = reload(client, path)
        assert response.status_code == 400, response.text
        answer = response.json()
        assert answer["success"] is False and "model_path" in answer["detail"]
        assert answer["weight_version"] == 0
    assert greedy(client)["output_ids"] == before["output_ids"]
    assert client.get("/health").json()["weight_version"] == 0


def test_new_weights_change_outputs_and_bump_the_version(
    client: httpx.Client, server: Any, perturbed_checkpoint: Path
) -> None:
    original = greedy(client)
    assert original["meta_info"]["weight_version"] == 0
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        in_flight = pool.submit(greedy, client, 40)
        response = reload(client, perturbed_checkpoint)
        survivor = in_flight.result()
    assert response.status_code == 200, response.text
    assert response.json()["success"] is True and response.json()["weight_version"] == 1
    # the request in flight finished, entirely under the weights it started with
    assert survivor["meta_info"]["completion_tokens"] == 40
    assert survivor["meta_info"]["weight_version"] == 0
    assert survivor["output_ids"][:8] == original["output_ids"]
    changed = greedy(client)
    assert changed["meta_info"]["weight_version"] == 1
    assert changed["output_ids"] != original["output_ids"]
    assert client.get("/health").json()["weight_version"] == 1

    restored = reload(client, server.model_path)
    assert restored.json()["weight_version"] == 2
    again = greedy(client)
    assert again["output_ids"] == original["output_ids"]
    assert again["meta_info"]["weight_version"] == 2


@pytest.fixture(scope="module")
def lora_adapter(test_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PEFT LoRA adapter with random (non-zero) weights for the test model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(test_model_path, dtype="float32")
    config = LoraConfig(
        r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    folder = tmp_path_factory.mktemp("lora")
    get_peft_model(model, config).save_pretrained(folder)
    return folder


def test_lora_adapter_is_merged_and_served_under_its_name(
    client: httpx.Client, lora_adapter: Path, tmp_path: Path
) -> None:
    base = greedy(client)
    version = base["meta_info"]["weight_version"]
    refused = client.post(
        "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)}
    )
    assert refused.status_code == 400 and "adapter_config.json" in refused.json()["detail"]

    body = {"lora_name": "adapted", "lora_path": str(lora_adapter)}
    loaded = client.post("/v1/load_lora_adapter", json=body)
    assert loaded.status_code == 200, loaded.text
    assert loaded.json()["weight_version"] == version + 1
    assert "adapted" in [card["id"] for card in client.get("/v1/models").json()["data"]]
    request = {
        "model": "adapted",
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
    }
    completion = client.post("/v1/completions", json=request)
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["token_ids"] != base["output_ids"]
