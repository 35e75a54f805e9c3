"""In-flight weight sync against a real engine on one GPU (manual: ``scripts/test-vllm-gpu``,
``scripts/test-sglang-gpu`` start the engine and set the variables below).

``ATROPOS_GPU_ENGINE``: ``vllm`` (the ``ipc`` backend: trainer and engine share the GPU) or
``sglang`` (the ``disk`` method: NCCL cannot put two ranks of one group on one GPU);
``ATROPOS_GPU_URL``: the running engine. The trainer pushes the test model with noise added,
in ``keep`` mode, while 8 replies are being sampled: the version reads back, the greedy answer
changes, and every reply's tokens and logprobs come back (vLLM: with per-token versions).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
import torch

pytestmark = pytest.mark.manual

PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def _greedy(url: str, model: str) -> str:
    body = {"model": model, "prompt": PROMPT_IDS, "max_tokens": 12, "temperature": 0}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    answer.raise_for_status()
    return str(answer.json()["choices"][0]["text"])


def test_inflight_push_on_one_gpu(test_model_path: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atroposlib.envs.server_handling.server_manager import ServerManager
    from example_trainer.checkpoint import save_weights
    from example_trainer.inflight import Fleet, make_live_sync
    from example_trainer.inflight.tensors import PushedWeights, hf_tensors

    engine, url = os.environ["ATROPOS_GPU_ENGINE"], os.environ["ATROPOS_GPU_URL"]
    model = AutoModelForCausalLM.from_pretrained(test_model_path, dtype=torch.bfloat16).cuda()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(
                torch.randn_like(parameter) * parameter.float().std().to(parameter) * 0.3
            )
    folder = tmp_path / "step-1"
    save_weights(model, folder)
    before = _greedy(url, str(test_model_path))
    transport = "ipc" if engine == "vllm" else "disk"
    sync = make_live_sync(engine, Fleet([url]), transport=transport, pause="keep", retries=0)  # type: ignore[arg-type]

    config = APIServerConfig(base_url=f"{url}/v1", model_name=str(test_model_path),
                             server_type=engine, api_key="x")  # type: ignore[arg-type]  # fmt: skip
    manager = ServerManager([config])
    sampling = {"max_tokens": 256, "temperature": 1.0, "ignore_eos": True}

    async def sample_while_pushing() -> list:
        replies = asyncio.create_task(manager.generate(PROMPT_IDS, 8, sampling))
        await asyncio.sleep(0.5)
        with hf_tensors(model, None) as tensors:
            report = await asyncio.to_thread(
                sync.push_live, PushedWeights(tensors, lambda: folder), 1
            )
        assert report.ok, report.failed
        return await replies

    sequences = asyncio.run(sample_while_pushing())
    sync.close()
    assert _greedy(url, str(test_model_path)) != before
    assert len(sequences) == 8
    for seq in sequences:
        assert len(seq.output_ids) == len(seq.logprobs) == 256
    if engine == "vllm":  # SGLang reports one weight_version per reply, not spans
        assert all(s.token_versions is not None for s in sequences)
        switched = [s for s in sequences if len(set(s.token_versions or ())) > 1]
        print(f"vllm: {len(switched)} of 8 replies span the update")
