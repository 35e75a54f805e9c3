"""A vLLM plugin (entry point group ``vllm.general_plugins``): weight transfer that works on
vLLM's CPU build.

vLLM's built-in transfer engines need CUDA (``nccl``, ``sparse_nccl``, ``nccl_m2n``: NCCL;
``ipc``: CUDA IPC handles) or Ray with NIXL (``sharded_rdt``), and the base engine's
``update_weights`` synchronizes an accelerator a CPU build does not have. This plugin registers
``shm``: the trainer writes each chunk into a POSIX shared-memory block on the same machine
(the layout our embedded server reads, :mod:`atroposlib.inference.weight_transfer`) and every
worker copies it out. Serve with ``--weight-transfer-config '{"backend": "shm"}'`` and
``VLLM_SERVER_DEV_MODE=1``; the trainer side is ``weight_sync: vllm``, ``sync_transport: shm``.

``scripts/setup-vllm-cpu`` installs this package (without its dependencies) into the vLLM
venv so the entry point is found; importing this module needs only vLLM and torch. Beside it,
:mod:`atroposlib.vllm_plugin.guard` is the middleware (``--middleware``) that puts our bearer
key on every route of a vLLM we start (it needs starlette, pydantic-settings and orjson, which
vLLM's venv has). :mod:`atroposlib.vllm_plugin.cpu_reload` mends vLLM's in-place reload on
CPU, where a tied LM head kept computing with the first weights it was served.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

ENGINES = {"shm": ("atroposlib.vllm_plugin.shm_engine", "SharedMemoryWeightTransferEngine")}


def register() -> None:
    """Add our engines to vLLM's weight-transfer registry, and make its in-place reload re-pack
    the CPU GEMMs it leaves stale (idempotent: vLLM loads general plugins once in every process
    it starts)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from atroposlib.vllm_plugin.cpu_reload import patch_inplace_reload

    patch_inplace_reload()

    for name, (module, cls) in ENGINES.items():
        try:
            WeightTransferEngineFactory.register_engine(name, module, cls)
        except ValueError:
            logger.debug("weight transfer engine %r is already registered", name)
