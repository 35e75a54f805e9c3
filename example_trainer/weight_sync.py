"""Getting new weights into the inference servers: one interface, one class per way.

- ``DiskReload``: the trainer writes an HF folder; each server reloads it with
  ``POST /update_weights_from_disk {"model_path": ..., "weight_version": step}`` (our embedded
  server, SGLang), which waits for the requests in flight; the version is read back after.
- ``VllmRestart``: the trainer owns one vLLM process per URL and restarts it on the folder.
- ``LoraHotLoad``: the trainer writes a peft adapter; each server hot-loads it with
  ``POST /v1/load_lora_adapter`` (vLLM with runtime LoRA updating, SGLang).

- ``embedded`` / ``vllm`` / ``sglang``: the engines' native in-flight updates
  (:mod:`example_trainer.inflight`): weights reach the servers while requests are in flight.

Every server in the list is updated; each failure is retried ``retries`` times with backoff and
reported in the returned ``SyncReport``; a push that still failed stops the run
(:class:`~example_trainer.sync_report.WeightSyncError`, raised by the loop).
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlparse

import httpx
from torch import Tensor, nn

from atroposlib.utils.health import NotHealthyError, wait_healthy
from atroposlib.utils.ports import PortTakenError, ensure_port_free, host_port
from example_trainer.config import LIVE_SYNC, TrainerConfig
from example_trainer.sync_report import SyncReport

logger = logging.getLogger(__name__)

PORT_RELEASE_S = 30.0


class WeightSync(Protocol):
    writes: Literal["full", "adapter", "tensors"]
    """What the loop hands over: a full HF folder or a peft adapter folder (``push``), or the
    weights themselves (``push_live``, the in-flight strategies)."""

    def start(self, model_path: str) -> None: ...
    def push(self, weights: Path, step: int) -> SyncReport: ...
    def close(self) -> None: ...


_FINAL_STATUSES = {400, 401, 403, 404, 405, 413, 422}


def _post_until_ok(
    client: httpx.Client, url: str, body: dict[str, Any], retries: int, backoff: float
) -> str | None:
    """POST until a 2xx that does not say success=false in JSON; None, or the last error.

    Connection errors, timeouts and 5xx are retried with exponential backoff; a refusal
    (success=false, or a 4xx such as 400 for a bad model_path) is final at once.
    """
    error = "not attempted"
    for attempt in range(retries + 1):
        final = False
        try:
            response = client.post(url, json=body)
            # SGLang and ours answer JSON ({"success": ...}); vLLM's load_lora_adapter answers
            # plain text ("Success: LoRA adapter ... added successfully.")
            json_answer = "json" in response.headers.get("content-type", "")
            payload = response.json() if response.is_success and json_answer else {}
            if response.is_success and (
                not isinstance(payload, dict) or payload.get("success", True)
            ):
                return None
            if response.is_success:
                error, final = f"success=false: {payload.get('message')}", True
            else:
                error = f"HTTP {response.status_code}: {response.text[:200]}"
                final = response.status_code in _FINAL_STATUSES
        except (httpx.HTTPError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        logger.warning("weight push to %s failed (attempt %d): %s", url, attempt + 1, error)
        if final:
            break
        if attempt < retries:
            time.sleep(backoff * 2**attempt)
    return error


def _push_each(urls: list[str], step: int, update: Callable[[str], str | None]) -> SyncReport:
    """Update every server in turn (``update`` answers None or the error) and report."""
    report, started = SyncReport(step), time.perf_counter()
    for url in urls:
        error = update(url)
        if error is None:
            report.updated.append(url)
        else:
            report.failed[url] = error
    report.seconds = time.perf_counter() - started
    return report


class _HttpSync:
    path = ""
    readback: str | None = None
    """GET path answering ``{"weight_version": ...}``, to check each server took the push."""
    writes: Literal["full", "adapter", "tensors"] = "full"

    def __init__(
        self,
        urls: list[str],
        *,
        retries: int = 3,
        timeout: float = 300.0,
        backoff: float = 0.5,
        api_key: str | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.retries, self.backoff = retries, backoff
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = http_client or httpx.Client(timeout=timeout, headers=headers)

    def start(self, model_path: str) -> None:
        """Servers are started by the user; nothing to do."""

    def body(self, weights: Path, step: int) -> dict[str, Any]:
        raise NotImplementedError

    def push(self, weights: Path, step: int) -> SyncReport:
        body = self.body(weights, step)
        return _push_each(
            self.urls,
            step,
            lambda url: (
                _post_until_ok(self.client, url + self.path, body, self.retries, self.backoff)
                or self._read_back(url, str(step))
            ),
        )

    def _read_back(self, url: str, version: str) -> str | None:
        """None if ``url`` serves ``version`` (or cannot say: no such route), else why not."""
        if self.readback is None:
            return None
        try:
            response = self.client.get(url + self.readback)
        except httpx.HTTPError as exc:
            return f"version read-back failed: {type(exc).__name__}: {exc}"
        if response.status_code in (404, 405):
            return None  # a server without SGLang's read-back route
        got = response.json().get("weight_version") if response.is_success else response.text
        if str(got) != version:
            return f"reports weight_version {got!r} after the update to {version!r}"
        return None

    def close(self) -> None:
        self.client.close()


class DiskReload(_HttpSync):
    path = "/update_weights_from_disk"
    readback = "/get_weight_version"

    def body(self, weights: Path, step: int) -> dict[str, Any]:
        return {"model_path": str(weights.resolve()), "weight_version": str(step)}


class LoraHotLoad(_HttpSync):
    path = "/v1/load_lora_adapter"
    writes: Literal["full", "adapter", "tensors"] = "adapter"

    def __init__(self, urls: list[str], adapter_name: str, **kwargs: Any) -> None:
        super().__init__(urls, **kwargs)
        self.adapter_name = adapter_name

    def body(self, weights: Path, step: int) -> dict[str, Any]:
        return {
            "lora_name": self.adapter_name,
            "lora_path": str(weights.resolve()),
            "load_inplace": True,
        }


class VllmRestart:
    """One server process per URL, started from ``command`` ({model}, {port}) and restarted;
    never on a port something else listens on, and healthy only once it answers itself.

    A restarted vLLM labels its weights ``"default"`` (which envs read as step 0); each is told
    its step through ``/update_weight_version`` (``VLLM_SERVER_DEV_MODE``, behind our guard),
    so the versions its replies carry are right; where that route is closed, a warning says the
    versions after a restart read as 0."""

    writes: Literal["full", "adapter", "tensors"] = "full"

    def __init__(
        self,
        urls: list[str],
        command: str,
        *,
        retries: int = 3,
        ready_timeout: float = 600.0,
        env: dict[str, str] | None = None,
        api_key: str | None = None,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.command, self.retries, self.ready_timeout = command, retries, ready_timeout
        self.env = {**os.environ, **(env or {})}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.unlabelled: set[str] = set()

    def _stop(self, url: str) -> bool:
        """Stop the server of ``url``; whether one was running."""
        proc = self.procs.pop(url, None)
        if proc is None or proc.poll() is not None:
            return False
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return True

    def _launch(self, url: str, model: str, release_s: float = 0.0) -> str | None:
        """Start the server of ``url``; ``release_s``: how long the port may take to be let go
        by the one just stopped (its workers can hold the socket a moment after it exits)."""
        port = urlparse(url).port or 8000
        deadline = time.monotonic() + release_s
        while True:
            try:
                ensure_port_free(host_port(url)[0], port, f"vLLM for {url}")
                break
            except PortTakenError as err:
                if time.monotonic() >= deadline:
                    return str(err)
                time.sleep(0.5)
        argv = shlex.split(self.command.format(model=model, port=port))
        self.procs[url] = proc = subprocess.Popen(argv, env=self.env)
        try:
            wait_healthy(f"{url}/health", timeout_s=self.ready_timeout, poll_s=0.5, process=proc)
        except NotHealthyError as err:
            return str(err)
        return None

    def _restart(self, url: str, model: str) -> str | None:
        error: str | None = "not attempted"
        for attempt in range(self.retries + 1):
            stopped = self._stop(url)
            error = self._launch(url, model, PORT_RELEASE_S if stopped else 0.0)
            if error is None:
                return None
            logger.warning("restarting %s failed (attempt %d): %s", url, attempt + 1, error)
        self._stop(url)
        return error

    def start(self, model_path: str) -> None:
        for url in self.urls:
            error = self._restart(url, model_path)
            if error is not None:
                raise RuntimeError(f"could not start inference server at {url}: {error}")

    def push(self, weights: Path, step: int) -> SyncReport:
        model = str(weights.resolve())

        def restart(url: str) -> str | None:
            error = self._restart(url, model)
            if error is None:
                self._label(url, step)
            return error

        return _push_each(self.urls, step, restart)

    def _label(self, url: str, step: int) -> None:
        """Tell the restarted server its weights are ``step``'s (a warning, once per server,
        where it cannot be told)."""
        body = {"new_version": str(step)}
        try:
            answer = httpx.post(f"{url}/update_weight_version", json=body, headers=self.headers,
                                timeout=30)  # fmt: skip
            refused = None if answer.is_success else f"HTTP {answer.status_code}"
        except httpx.HTTPError as error:
            refused = f"{type(error).__name__}: {error}"
        if refused and url not in self.unlabelled:
            self.unlabelled.add(url)
            logger.warning(
                "%s: could not label the restarted vLLM with its step (%s): the weight versions "
                "its replies carry read as 0 until it is; serve it with VLLM_SERVER_DEV_MODE=1 "
                "behind --middleware atroposlib.vllm_plugin.guard.VllmGuard",
                url,
                refused,
            )

    def close(self) -> None:
        for url in list(self.procs):
            self._stop(url)


class NoSync:
    writes: Literal["full", "adapter", "tensors"] = "full"

    def start(self, model_path: str) -> None:
        """Nothing to start."""

    def push(self, weights: Path, step: int) -> SyncReport:
        return SyncReport(step)

    def close(self) -> None:
        """Nothing to close."""


def make_weight_sync(
    mode: str,
    urls: list[str],
    *,
    retries: int = 3,
    timeout: float = 300.0,
    vllm_command: str = "",
    adapter_name: str = "atropos",
    api_key: str | None = None,
    http_client: httpx.Client | None = None,
) -> WeightSync:
    http = {"retries": retries, "timeout": timeout, "api_key": api_key, "http_client": http_client}
    if mode == "disk":
        return DiskReload(urls, **http)  # type: ignore[arg-type]
    if mode == "lora":
        return LoraHotLoad(urls, adapter_name, **http)
    if mode == "vllm_restart":
        return VllmRestart(
            urls, vllm_command, retries=retries, ready_timeout=timeout, api_key=api_key
        )
    return NoSync()


def sync_for(cfg: TrainerConfig) -> WeightSync:
    """The strategy ``cfg.weight_sync`` names, with its settings."""
    if cfg.weight_sync in LIVE_SYNC:
        from example_trainer.inflight import Fleet, make_live_sync

        fleet = Fleet(cfg.inference_urls, timeout=cfg.sync_timeout, api_key=_inference_key(cfg))
        return make_live_sync(
            cfg.weight_sync,  # type: ignore[arg-type]
            fleet,
            transport=cfg.sync_transport,
            pause=cfg.sync_pause,
            chunk_bytes=cfg.sync_chunk_mb << 20,
            verify=cfg.sync_verify,
            recompute_kv=cfg.sync_recompute_kv,
            retries=cfg.sync_retries,
            master_address=cfg.sync_master_address,
            master_port=cfg.sync_master_port,
        )
    return make_weight_sync(
        cfg.weight_sync,
        cfg.inference_urls,
        retries=cfg.sync_retries,
        timeout=cfg.sync_timeout,
        vllm_command=cfg.vllm_command,
        adapter_name=cfg.lora.adapter_name,
        api_key=_inference_key(cfg),
    )


def push_weights(
    sync: WeightSync,
    model: nn.Module,
    state_dict: dict[str, Tensor] | None,
    folder: Path,
    write_folder: Callable[[], None],
    step: int,
) -> SyncReport:
    """Hand this step's weights to ``sync``: as a folder ``write_folder`` writes at ``folder``,
    or (in-flight strategies) as tensors, the folder written only if its transport needs one."""
    if sync.writes != "tensors":
        write_folder()
        return sync.push(folder, step)
    from example_trainer.inflight.tensors import PushedWeights, hf_tensors

    def written() -> Path:
        if not folder.exists():
            write_folder()
        return folder

    with hf_tensors(model, state_dict) as tensors:
        return sync.push_live(PushedWeights(tensors, written), step)  # type: ignore[attr-defined]


def _inference_key(cfg: TrainerConfig) -> str | None:
    key = cfg.inference_api_key
    return key.get_secret_value() if key is not None else None
