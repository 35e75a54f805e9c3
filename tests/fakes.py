"""Test doubles and helpers shared by every test area (one copy each, imported as
``tests.fakes``). Real parts are preferred everywhere a test can afford them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker, shared_memory
from typing import Any

PROCESS_START_TIMEOUT_S = 180.0
"""How long a test waits for a server process it started (broker, env, fake engine) to answer:
one CI run on a loaded 2-core machine took over 60 s to start a broker (2026-12-02)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


HEALTH_SERVER = """
import http.server, signal, sys

class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"""
"""``python -c HEALTH_SERVER PORT``: answers 200 to every GET on 127.0.0.1:PORT."""


@contextmanager
def health_server(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """A process of its own answering 200 on 127.0.0.1:``port`` (another server already on a
    port), running once it answers; stopped at the end."""
    from atroposlib.utils.health import wait_healthy

    process = subprocess.Popen([sys.executable, "-c", HEALTH_SERVER, str(port)])
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=PROCESS_START_TIMEOUT_S,
                     poll_s=0.02, process=process)  # fmt: skip
        yield process
    finally:
        process.terminate()
        process.wait(timeout=10)


class CharTokenizer:
    """Enough of a tokenizer for tokenize_for_trainer: one token per character."""

    eos_token_id = 0

    def apply_chat_template(
        self, chat: list[dict[str, Any]], tokenize: bool = True, add_generation_prompt: bool = False
    ) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}" for m in chat)
        text += "<assistant>" if add_generation_prompt else ""
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)


class ChatCharTokenizer:
    """A chat tokenizer with one token per character, a BOS (1) that ``encode`` adds with
    ``add_special_tokens`` and that decoding skips, and a template that renders ``tools``."""

    bos_token_id = 1
    eos_token_id = 2

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([self.bos_token_id] if add_special_tokens else []) + [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        special = (self.bos_token_id, self.eos_token_id) if skip_special_tokens else ()
        return "".join(chr(i) for i in ids if i not in special)

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(128)}

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        text = f"<tools>{json.dumps(tools)}</tools>" if tools else ""
        text += "".join(f"<{m['role']}>{m.get('content') or ''}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


@contextmanager
def uvicorn_on_loopback(app: Any) -> Iterator[str]:
    """``app`` served by a real uvicorn on a free 127.0.0.1 port, in a thread; its base URL.
    Forwarded headers are not trusted, as our servers run (``proxy_headers=False``)."""
    import uvicorn

    config = uvicorn.Config(
        app, host="127.0.0.1", port=free_port(), log_level="warning", proxy_headers=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def trainer_block(size: int, name: str | None = None) -> Iterator[shared_memory.SharedMemory]:
    """A block as the trainer creates it. The server side, here in the same process, stops
    this process's resource tracker from tracking it; tracked again before the unlink, so
    the tracker is not asked to forget it twice."""
    block = shared_memory.SharedMemory(name=name, create=True, size=size)
    try:
        yield block
    finally:
        block.close()
        resource_tracker.register(block._name, "shared_memory")  # type: ignore[attr-defined]
        block.unlink()
