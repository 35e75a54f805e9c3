"""Starting and stopping a real embedded inference server process for tests."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from atroposlib.inference.batch import Sequence
from atroposlib.inference.engine import ModelRunner
from atroposlib.utils.health import wait_healthy
from tests.fakes import free_port

SERVED_NAME = "smol"
SERVER_FLAGS = ("--threads", os.environ.get("ATROPOS_TEST_TORCH_THREADS", "1"))
"""One torch thread: on a 2-core machine shared with other test processes, more threads spin."""


@dataclass
class RunningServer:
    url: str
    model_path: Path
    process: subprocess.Popen[bytes]
    name: str = SERVED_NAME
    log_path: Path | None = None

    def state(self, lines: int = 30) -> str:
        """Whether the process still runs and its log's last lines: for a failure's message."""
        code = self.process.poll()
        status = "running" if code is None else f"exited with code {code}"
        log = self.log_path.read_text(errors="replace") if self.log_path else ""
        tail = "\n".join(log.splitlines()[-lines:])
        return f"the inference server is {status}; its log ends:\n{tail}"


def start_server(
    model_path: Path, env: dict[str, str], log_path: Path, *extra: str
) -> RunningServer:
    port = free_port()
    command = [sys.executable, "-m", "atroposlib.inference", "--model", str(model_path)]
    command += ["--port", str(port), "--served-model-name", SERVED_NAME, *extra]
    log = open(log_path, "wb")  # noqa: SIM115 - the child process owns it
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/health", timeout_s=180, poll_s=0.5, process=process,
                     log_path=log_path, name="the inference server")  # fmt: skip
    except BaseException:
        process.kill()
        raise
    return RunningServer(url, model_path, process, log_path=log_path)


def stop_server(server: RunningServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


def chat(runner: ModelRunner, question: str) -> list[int]:
    text = runner.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    return list(runner.tokenizer.encode(str(text), add_special_tokens=False))


def forward_logprobs(runner: ModelRunner, seq: Sequence) -> torch.Tensor:
    with torch.no_grad():
        ids = torch.tensor([seq.prompt_ids + seq.output_ids])
        logits = runner.model(ids).logits[0, len(seq.prompt_ids) - 1 : -1]
    temperature = seq.params.temperature or 1.0
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    return log_probs.gather(-1, torch.tensor(seq.output_ids)[:, None])[:, 0]
