"""Weight reloads on vLLM's CPU build: re-pack the GEMMs of layers that keep their weight.

vLLM's CPU build computes every linear layer with a packed copy of its weight (oneDNN or
sgl-kernel), made in ``process_weights_after_loading``. An in-place reload (``reload_weights``
from disk, or a weight-transfer engine) re-runs that step only for layers whose own tensors were
loaded. A tied LM head loads nothing of its own (its weight *is* the embedding's), so it keeps
packing the first weights it was served with: after a push, the embeddings are new and the
logits are computed against the old ones (measured on SmolLM2-135M in vLLM 0.32: logits 24
apart from the new weights', 1e-5 from the old). Here every layer that still holds its weight
beside a packed copy is packed again after each reload. GPU builds use the weight itself and
are left alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

logger = logging.getLogger(__name__)

_PATCHED = "_atroposlib_repacks_cpu_gemms"


def repack_cpu_gemms(model: nn.Module) -> int:
    """Pack again every CPU GEMM whose layer kept its weight; returns how many. Layers packed
    with their weight removed were re-packed by the reload itself (their weight is empty)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    repacked = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (
            hasattr(module, "cpu_linear")
            and not getattr(module, "_cpu_skip_gemm_dispatch", False)
            and isinstance(weight, Tensor)
            and weight.ndim == 2
            and weight.numel() > 0
            and not weight.is_meta
        ):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            repacked += 1
    return repacked


def finish_reload(model: nn.Module, model_config: Any) -> None:
    """vLLM's ``finalize_layerwise_reload``, then :func:`repack_cpu_gemms`."""
    from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_reload

    finalize_layerwise_reload(model, model_config)
    repacked = repack_cpu_gemms(model)
    if repacked:
        logger.info("re-packed %d CPU GEMM(s) that share or keep their weight", repacked)


def patch_inplace_reload() -> None:
    """Make vLLM's own ``reload_weights`` (``/collective_rpc reload_weights``, the trainer's
    disk transport) finish with :func:`finish_reload`; idempotent."""
    from vllm.model_executor.model_loader.reload import inplace

    original: Callable[..., None] = inplace.finalize_layerwise_reload
    if getattr(original, _PATCHED, False):
        return

    @functools.wraps(original)
    def finalize(model: nn.Module, model_config: Any, *args: Any, **kwargs: Any) -> None:
        original(model, model_config, *args, **kwargs)
        repack_cpu_gemms(model)

    setattr(finalize, _PATCHED, True)
    inplace.finalize_layerwise_reload = finalize
