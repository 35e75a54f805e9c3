"""The embedded inference server as the benchmarks start it: for throughput figures
(``start_embedded``) and for a held-out evaluation against it (``served_evaluation``)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from atroposlib.utils.health import wait_healthy

ROOT = Path(__file__).resolve().parents[1]
EVAL_SCRIPT = ROOT / "environments" / "reasoning_gym" / "env.py"
"""The demo's environment: ``env.py evaluate`` is atropos-local's held-out evaluation."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_embedded(
    model_path: Path,
    threads: int | None,
    max_batch: int,
    source: Path = ROOT,
    extra: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """The embedded server of the checkout at ``source`` on a free port (``extra``: more
    flags), once it answers ``/health``; (process, url)."""
    port = _free_port()
    command = [sys.executable, "-m", "atroposlib.inference", "--model", str(model_path)]
    command += ["--port", str(port), "--max-batch-size", str(max_batch), "--log-level", "warning"]
    if threads:
        command += ["--threads", str(threads)]
    command += list(extra)
    env = {**os.environ, "PYTHONPATH": str(source), "HF_HUB_OFFLINE": "1"}
    log = tempfile.NamedTemporaryFile(prefix="embedded-", suffix=".log", delete=False)  # noqa: SIM115
    # cwd too: `python -m` puts the working directory ahead of PYTHONPATH
    process = subprocess.Popen(command, env=env, cwd=source, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", timeout_s=300, poll_s=0.5, process=process,
                     log_path=Path(log.name), name="the embedded server")  # fmt: skip
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process, url


def served_evaluation(
    model: Path | str,
    env_config: Path,
    out_dir: Path,
    *,
    eval_size: int,
    threads: int,
    max_token_length: int,
    server_flags: Sequence[str] = (),
    env_flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_s: float = 300.0,
) -> None:
    """Serve ``model`` with the embedded server on a free port (its output in
    ``out_dir/server.log``), run ``env.py evaluate`` with ``env_config`` against it and stop
    the server: the evaluation's ``metrics.json`` and ``samples.jsonl`` are in ``out_dir``.
    ``server_flags`` and ``env_flags`` go to the server and the evaluation. Raises
    ``NotHealthyError`` (naming the log) if the server cannot serve ``model``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port, log_path = _free_port(), out_dir / "server.log"
    child_env = {**(os.environ if env is None else env)}
    child_env.setdefault("HF_HUB_OFFLINE", "1")
    child_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    child_env.pop("ATROPOS_API_KEY", None)  # a private server on a free port, for one evaluation
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "atroposlib.inference", "--model", str(model),
             "--port", str(port), "--served-model-name", "default", "--threads", str(threads),
             *server_flags],
            stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=ROOT,
        )  # fmt: skip
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=startup_s, process=server,
                     log_path=log_path, name=f"the inference server for {model}")  # fmt: skip
        subprocess.run(
            [sys.executable, str(EVAL_SCRIPT), "evaluate", "--config", str(env_config),
             "--openai.base_url", f"http://127.0.0.1:{port}/v1",
             "--openai.model_name", "default", "--openai.server_type", "embedded",
             "--env.tokenizer_name", str(model), "--env.max_token_length", str(max_token_length),
             "--env.eval_size", str(eval_size), "--env.data_dir_to_save_evals", str(out_dir),
             *env_flags],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=child_env,
            cwd=ROOT,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=60)
