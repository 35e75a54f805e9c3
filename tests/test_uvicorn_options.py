"""Every server of ours starts uvicorn with ``proxy_headers=False``: uvicorn otherwise takes the
client address from ``X-Forwarded-For`` on any connection from loopback, so one local client
could pass for many (the proxy's per-client cap counts by address). A new ``uvicorn.run`` or
``uvicorn.Config`` in the library or the trainer's servers without it fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_SOURCES = (ROOT / "atroposlib", ROOT / "example_trainer")


def uvicorn_starts() -> list[tuple[str, ast.Call]]:
    found = []
    paths = sorted(path for folder in SERVER_SOURCES for path in folder.rglob("*.py"))
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "uvicorn"
                and node.func.attr in ("run", "Config")
            ):
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", node))
    return found


def test_every_uvicorn_server_ignores_forwarded_headers() -> None:
    starts = uvicorn_starts()
    assert len(starts) >= 4, starts  # broker, inference server, proxy command, env's proxy
    for where, call in starts:
        options = {k.arg: k.value for k in call.keywords}
        flag = options.get("proxy_headers")
        assert isinstance(flag, ast.Constant) and flag.value is False, where
