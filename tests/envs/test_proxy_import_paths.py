"""Atropos's import paths of the managed-server proxy re-export ``atroposlib.proxy``'s objects,
and nothing of ours imports through them (nor through the paths our own modules left)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OLD = "atroposlib.envs.server_handling"
SHIMS = {
    f"{OLD}.managed_server_proxy": {
        "create_app": "atroposlib.proxy.app",
        "openai_error": "atroposlib.proxy.app",
        "ProxySettings": "atroposlib.proxy.app",
        "main": "atroposlib.proxy.cli",
        "ChatCompletionProxyRequest": "atroposlib.proxy.protocol",
        "ChatMessage": "atroposlib.proxy.protocol",
        "RenderResponse": "atroposlib.proxy.protocol",
        "SessionCreateRequest": "atroposlib.proxy.protocol",
        "SessionCreateResponse": "atroposlib.proxy.protocol",
        "SessionState": "atroposlib.proxy.session",
        "APIServerConfig": f"{OLD}.server_baseline",
        "DummyManagedServer": f"{OLD}.managed_server",
        "ManagedServer": f"{OLD}.managed_server",
        "OpenAIServer": f"{OLD}.openai_server",
        "ServerManager": f"{OLD}.server_manager",
        "ToolCallTranslator": f"{OLD}.tool_call_translator",
    },
    f"{OLD}.proxy_client": {
        "ProxyManagedServer": "atroposlib.proxy.client",
        "create_proxy_session": "atroposlib.proxy.client",
        "ProxyError": "atroposlib.proxy.client",
        "ProxyRejectedError": "atroposlib.proxy.client",
        "node_trajectory": "atroposlib.proxy.client",
        "SequenceNode": f"{OLD}.managed",
    },
}
GONE = [f"{OLD}.{name}" for name in ("proxy_session", "session_table", "proxy_protocol",
                                     "proxy_cli", "proxy_access", "local_proxy")]  # fmt: skip
"""Our own proxy modules that Atropos never had: moved without a shim."""
OUR_CODE = ("atroposlib", "environments", "example_trainer", "benchmarks", "scripts", "tests")


@pytest.mark.parametrize(("old", "name", "home"), [
    (old, name, home) for old, names in SHIMS.items() for name, home in names.items()
])  # fmt: skip
def test_an_atropos_path_gives_the_same_object_as_its_home(old: str, name: str, home: str) -> None:
    assert getattr(importlib.import_module(old), name) is getattr(
        importlib.import_module(home), name
    )


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_a_shim_exports_exactly_its_table(old: str) -> None:
    assert sorted(importlib.import_module(old).__all__) == sorted(SHIMS[old])


@pytest.mark.parametrize("gone", GONE)
def test_our_own_old_paths_are_gone(gone: str) -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(gone)


def _imported_modules(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_nothing_of_ours_imports_the_old_proxy_paths() -> None:
    shim_files = {REPO / (old.replace(".", "/") + ".py") for old in SHIMS}
    old_paths = set(SHIMS) | set(GONE)
    offenders = [
        f"{path.relative_to(REPO)}: {module}"
        for folder in OUR_CODE
        for path in sorted((REPO / folder).rglob("*.py"))
        if path not in shim_files
        for module in _imported_modules(path)
        if module in old_paths
    ]
    assert offenders == [], "import atroposlib.proxy instead"


def test_atropos_proxy_command_still_runs() -> None:
    """Atropos's README serves the proxy with ``python -m`` on its old module."""
    done = subprocess.run(
        [sys.executable, "-m", f"{OLD}.managed_server_proxy", "--help"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--config" in done.stdout
