"""Test doubles and helpers shared by every test area (one copy each, imported as
``tests.fakes``). Real parts are preferred everywhere a test can afford them."""

from __future__ import annotations

import socket
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
