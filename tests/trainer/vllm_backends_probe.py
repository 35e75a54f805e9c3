"""Run by the vLLM venv's python (tests/trainer/test_vllm_transfer_backends.py): tries every
weight-transfer engine vLLM registers, worker side and trainer side, as a CPU-only machine
runs them, and our ``shm`` engine's staging checks; prints one JSON object."""

from __future__ import annotations

import json
import sys
import tempfile
import types
from typing import Any

import torch
from safetensors.torch import save_file
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer.base import ModuleSource
from vllm.distributed.weight_transfer.factory import (
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)
from vllm.plugins import load_general_plugins

load_general_plugins()  # what every vLLM process does first: our entry point registers shm
NCCL_INIT = {"master_address": "127.0.0.1", "master_port": 29777, "rank_offset": 1, "world_size": 2}
INIT: dict[str, dict[str, Any]] = {
    "nccl": NCCL_INIT,
    "sparse_nccl": NCCL_INIT,
    "nccl_m2n": {
        **NCCL_INIT,
        "src_mesh_dims": [1, 1],
        "dst_mesh_dims": [1, 1],
        "names": ["weight"],
        "dtype_names": ["float32"],
        "shapes": [[2, 2]],
        "src_placements": [None],
    },
}
UPDATE = {"names": ["weight"], "dtype_names": ["float32"], "shapes": [[2, 2]], "ipc_handles": [{}]}


def config(model_folder: str) -> Any:
    parallel = types.SimpleNamespace(
        data_parallel_index=0,
        world_size=1,
        rank=0,
        distributed_executor_backend="uni",
        world_size_across_dp=1,
    )
    model = types.SimpleNamespace(dtype=torch.float32, model=model_folder)
    return types.SimpleNamespace(parallel_config=parallel, model_config=model)


def said(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


def worker(name: str, vllm_config: Any) -> str:
    stage = "create"
    try:
        engine = WeightTransferEngineFactory.create_engine(
            WeightTransferConfig(backend=name),
            vllm_config,
            torch.device("cpu"),
            torch.nn.Linear(2, 2),
        )
        stage = "init"
        engine.init_transfer_engine(engine.parse_init_info(INIT.get(name, {})))
        stage = "update"
        engine.start_weight_update()
        engine.update_weights(UPDATE)
    except Exception as error:  # every failure is the finding
        return f"{stage}: {said(error)}"
    return "ok"


class Client:
    def init_weight_transfer_engine(self, init_info: dict) -> None: ...
    def start_weight_update(self) -> None: ...
    def update_weights(self, update_info: Any) -> None: ...
    def finish_weight_update(self, weight_version: str | None = None) -> None: ...


def trainer(name: str) -> str:
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    info = (
        IPCTrainerInitInfo(rank=0)
        if name == "ipc"
        else NCCLTrainerInitInfo(
            master_address="127.0.0.1", master_port=29778, world_size=2, rank=0
        )
    )
    try:
        WeightTransferTrainerFactory.trainer_init(
            info, client=Client(), source=ModuleSource(torch.nn.Linear(2, 2))
        )
    except Exception as error:
        return f"trainer_init: {said(error)}"
    return "ok"


def shm_checks(vllm_config: Any) -> dict[str, str]:
    """Our engine against a served checkpoint holding ``w`` (2, 3): a good chunk is staged;
    a wrong name or shape, a block not named with the session's prefix, one of another size
    than declared and one others may read are refused with a message naming them."""
    import os
    from multiprocessing import shared_memory

    from atroposlib.inference.weight_transfer import new_shm_prefix

    engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend="shm"), vllm_config, torch.device("cpu"), torch.nn.Linear(2, 2)
    )
    prefix = new_shm_prefix()
    engine.init_transfer_engine(engine.parse_init_info({"shm_prefix": prefix}))
    block = shared_memory.SharedMemory(name=f"{prefix}probe", create=True, size=64)
    foreign = shared_memory.SharedMemory(create=True, size=64)
    out = {}
    try:
        for case, name, shape, changes in (
            ("good", "w", [2, 3], {}),
            ("name", "v", [2, 3], {}),
            ("shape", "w", [3, 2], {}),
            ("foreign", "w", [2, 3], {"shm_name": foreign.name}),
            ("size", "w", [2, 3], {"shm_bytes": 32}),
            ("mode", "w", [2, 3], {}),
        ):
            engine.start_weight_update()
            block.buf[:24] = torch.arange(6, dtype=torch.float32).numpy().tobytes()
            if case == "mode":
                os.fchmod(block._fd, 0o644)
            info = {
                "names": [name],
                "dtype_names": ["float32"],
                "shapes": [shape],
                "shm_name": block.name,
                "shm_bytes": block.size,
                **changes,
            }
            try:
                engine.update_weights(info)
                staged = engine._staged["w"]
                out[case] = f"staged {list(staged.shape)} sum {float(staged.sum())}"
            except Exception as error:
                out[case] = said(error)
    finally:
        for opened in (block, foreign):
            opened.close()
            opened.unlink()
    return out


def main() -> None:
    names = sys.argv[1:]
    with tempfile.TemporaryDirectory() as tmp:
        save_file({"w": torch.zeros(2, 3)}, f"{tmp}/model.safetensors")
        vllm_config = config(tmp)
        result = {
            "registered": sorted(WeightTransferEngineFactory._registry),
            "worker": {name: worker(name, vllm_config) for name in names},
            "trainer": {name: trainer(name) for name in ("nccl", "ipc")},
            "shm": shm_checks(vllm_config),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
