"""The trainer's weights as named tensors to send: Hugging Face names, LoRA merged, in chunks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from example_trainer.checkpoint import is_peft, unwrap

NamedTensors = Callable[[], Iterator[tuple[str, Tensor]]]
"""A fresh pass over the weights to send (Hugging Face names), each time it is called."""


@dataclass
class PushedWeights:
    """What a push can send: the tensors, or (disk backends) a folder written on demand."""

    tensors: NamedTensors
    folder: Callable[[], Path]


@contextmanager
def hf_tensors(model: nn.Module, state_dict: dict[str, Tensor] | None) -> Iterator[NamedTensors]:
    """The model's parameters under their Hugging Face names, one per tied group.

    A peft model's adapters are merged into the base weights for the duration (and taken out
    again after); ``state_dict`` (gathered from FSDP shards) replaces the module's tensors.
    """
    model = unwrap(model)
    if not is_peft(model):
        names = [name for name, _ in model.named_parameters()]
        source = state_dict if state_dict is not None else dict(model.named_parameters())
        yield lambda: ((name, source[name].detach()) for name in names if name in source)
        return
    model.merge_adapter()  # type: ignore[operator]
    try:
        yield lambda: (
            (_base_name(name), param.detach())
            for name, param in model.named_parameters()
            if "lora_" not in name
        )
    finally:
        model.unmerge_adapter()  # type: ignore[operator]


def _base_name(peft_name: str) -> str:
    """A peft parameter's name in the merged model.

    >>> _base_name("base_model.model.model.layers.0.q_proj.base_layer.weight")
    'model.layers.0.q_proj.weight'
    """
    return peft_name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def chunks(
    named: Iterator[tuple[str, Tensor]], limit_bytes: int, dtype: torch.dtype | None = None
) -> Iterator[dict[str, Tensor]]:
    """Consecutive groups of at most ``limit_bytes`` (a larger tensor travels alone), each
    tensor contiguous on the CPU in ``dtype`` (default: its own)."""
    chunk: dict[str, Tensor] = {}
    size = 0
    for name, tensor in named:
        cpu = tensor.detach().to("cpu", dtype or tensor.dtype).contiguous()
        nbytes = cpu.numel() * cpu.element_size()
        if chunk and size + nbytes > limit_bytes:
            yield chunk
            chunk, size = {}, 0
        chunk[name] = cpu
        size += nbytes
    if chunk:
        yield chunk


def with_last(items: Iterator[dict[str, Tensor]]) -> Iterator[tuple[dict[str, Tensor], bool]]:
    """Each item with whether it is the last one."""
    previous = next(items, None)
    for item in items:
        assert previous is not None
        yield previous, False
        previous = item
    if previous is not None:
        yield previous, True
