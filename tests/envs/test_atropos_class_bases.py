"""Our public classes answer ``issubclass`` / ``isinstance`` as atroposlib 0.4.0's do.

User code branches on types (hermes-agent takes its managed path, with real token ids, only
when ``not isinstance(server, OpenAIServer)``), so the hierarchy is API. The 0.4.0 wheel's
hierarchy is data in ``tests/envs/data/atropos_040_class_bases.json``, written by
``scripts/atropos_class_bases.py``; the slow test re-reads the wheel from PyPI.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import APIServer, APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from scripts import atropos_class_bases
from scripts.atropos_names import our_object

DATA = json.loads(atropos_class_bases.DATA.read_text())
EXTERNAL: dict[str, Any] = {
    "abc.ABC": abc.ABC, "asyncio.Semaphore": asyncio.Semaphore, "enum.Enum": enum.Enum,
    "pydantic.BaseModel": pydantic.BaseModel, "typing_extensions.TypedDict": typing.TypedDict,
}  # fmt: skip


def ancestors(defined_at: str) -> set[str]:
    """Every base of an Atropos class, transitively (atroposlib ids and external names)."""
    found: set[str] = set()
    pending = list(DATA["bases"].get(defined_at, []))
    while pending:
        base = pending.pop()
        if base not in found:
            found.add(base)
            pending += DATA["bases"].get(base, [])
    return found


def ours(public_name: str) -> type | None:
    module, _, name = public_name.partition(":")
    ok, obj = our_object(module, name)
    return obj if ok and isinstance(obj, type) else None


def our_classes() -> Iterator[tuple[str, str, type]]:
    """(public name, where Atropos defines it, our class) for every one we provide."""
    for public_name, defined_at in DATA["classes"].items():
        cls = ours(public_name)
        if cls is not None:
            yield public_name, defined_at, cls


def derives_from(cls: type, base: Any) -> bool:
    """By the MRO: ``issubclass(X, abc.ABC)`` is also True for any class with ``__aenter__``
    and ``__aexit__`` (AbstractAsyncContextManager's hook), in Atropos too."""
    if base is typing.TypedDict:
        return typing.is_typeddict(cls)
    return base in cls.__mro__


def test_every_pair_of_public_classes_answers_issubclass_as_atropos_0_4_0() -> None:
    # a TypedDict cannot be the right side of issubclass (in Atropos neither): its own
    # TypedDict-ness is compared with the external bases below
    representative = {defined_at: cls for _, defined_at, cls in our_classes()
                      if not typing.is_typeddict(cls)}  # fmt: skip
    wrong, compared = [], 0
    for public_name, defined_at, cls in our_classes():
        expected = ancestors(defined_at)
        for other, other_cls in representative.items():
            if other == defined_at:
                continue
            compared += 1
            if issubclass(cls, other_cls) != (other in expected):
                wrong.append(f"{public_name} subclass of {other}: atropos {other in expected}")
        for name, base in EXTERNAL.items():
            compared += 1
            if derives_from(cls, base) != (name in expected):
                wrong.append(f"{public_name} subclass of {name}: atropos {name in expected}")
    assert not wrong, "\n".join(wrong)
    assert compared > 1500 and len(representative) >= 35, (compared, len(representative))


def test_token_servers_are_not_openai_servers() -> None:
    from atroposlib.envs.server_handling.sglang_server import EmbeddedServer, SGLangServer
    from atroposlib.envs.server_handling.trl_vllm_server import TrlVllmServer
    from atroposlib.envs.server_handling.vllm_server import VLLMServer

    for cls in (VLLMServer, SGLangServer, EmbeddedServer, TrlVllmServer):
        assert issubclass(cls, APIServer) and not issubclass(cls, OpenAIServer), cls


@pytest.mark.parametrize(
    ("server_type", "openai"),
    [("openai", True), ("vllm", False), ("sglang", False), ("embedded", False)],
)
async def test_the_managed_path_check_users_write_picks_token_servers(
    server_type: str, openai: bool
) -> None:
    """hermes-agent's ``_use_managed_server``: ``not isinstance(servers[0], OpenAIServer)``."""
    config = APIServerConfig(
        server_type=server_type, base_url="http://127.0.0.1:9/v1", model_name="m",
        health_check=False,
    )  # fmt: skip
    manager = ServerManager([config])
    try:
        assert isinstance(manager.servers[0], OpenAIServer) is openai
        assert isinstance(manager.servers[0], APIServer)
    finally:
        await manager.close()


def test_the_testing_harness_is_not_an_api_server_as_in_atropos() -> None:
    manager = ServerManager([], testing=True)
    harness: Any = manager.servers[0]
    assert not isinstance(harness, APIServer) and harness.server_healthy is True


@pytest.mark.slow
def test_the_recorded_hierarchy_is_the_0_4_0_wheel_s(tmp_path: Path) -> None:
    """The data file is what the script reads from the wheel on PyPI now."""
    fresh = atropos_class_bases.read_wheel(None)
    assert fresh["classes"] == DATA["classes"] and fresh["bases"] == DATA["bases"]
