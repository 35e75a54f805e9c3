"""A stand-in inference server for weight-sync tests (real uvicorn process, real HTTP).

Serves a transformers model folder. ``/v1/completions`` takes token ids and returns the
model's logprobs of them, so new weights visibly change the output. ``/update_weights_from_disk``
has the SGLang shape plus ``weight_version``; ``/update_weight_version`` labels the weights as
vLLM's does; ``/v1/load_lora_adapter`` records adapters.
``--fail-first N`` answers the first N weight updates with HTTP 500 (to test retries).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException
from fastapi.responses import PlainTextResponse
from transformers import AutoModelForCausalLM


def create_app(model_path: str, fail_first: int) -> FastAPI:
    app = FastAPI()
    state: dict[str, Any] = {
        "model": AutoModelForCausalLM.from_pretrained(model_path),
        "model_path": model_path,
        "weight_version": 0,
        "failures_left": fail_first,
        "adapters": {},
    }

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "weight_version": state["weight_version"],
            "model_path": state["model_path"],
            "adapters": state["adapters"],
        }

    @app.post("/update_weights_from_disk")
    def update(body: dict[str, Any]) -> dict[str, Any]:
        if state["failures_left"] > 0:
            state["failures_left"] -= 1
            raise HTTPException(500, "injected failure")
        path = body["model_path"]
        if not (Path(path) / "config.json").is_file():
            return {"success": False, "message": f"{path} is not a model folder"}
        state["model"] = AutoModelForCausalLM.from_pretrained(path)
        state["model_path"] = path
        state["weight_version"] += 1
        return {"success": True, "message": "ok", "weight_version": state["weight_version"]}

    @app.post("/update_weight_version")
    def label(body: dict[str, Any]) -> dict[str, Any]:
        state["weight_version"] = body["new_version"]  # vLLM's label, a string
        return {}

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
    def load_lora(body: dict[str, Any]) -> str:
        if not (Path(body["lora_path"]) / "adapter_config.json").is_file():
            raise HTTPException(400, "lora_path has no adapter_config.json")
        state["adapters"][body["lora_name"]] = body["lora_path"]
        state["weight_version"] += 1
        # vLLM's answer: plain text, not JSON
        return f"Success: LoRA adapter '{body['lora_name']}' added successfully."

    @app.post("/v1/completions")
    def completions(body: dict[str, Any]) -> dict[str, Any]:
        ids = torch.tensor([body["prompt"]])
        with torch.no_grad():
            logp = torch.log_softmax(state["model"](input_ids=ids).logits[0, :-1], -1)
        token_logprobs = logp.gather(-1, ids[0, 1:, None])[:, 0].tolist()
        return {"choices": [{"logprobs": {"token_logprobs": token_logprobs}}]}

    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fail-first", type=int, default=0)
    args = parser.parse_args()
    uvicorn.run(create_app(args.model, args.fail_first), host="127.0.0.1", port=args.port)
