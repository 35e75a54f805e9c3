"""Checkpoints: a Hugging Face folder plus optimizer, scheduler, RNG and loop state.

``save_dir/step-N/`` holds the weights (``model.safetensors`` + config, or a peft adapter),
the tokenizer when there is one, and ``trainer_state.pt``. A checkpoint is written to a
temporary folder and renamed, so a crash never leaves a half-written ``step-N``. ``prune_steps``
keeps the newest N of them (and of the pushed weight folders); weights pushed at a checkpoint's
step are hard links to its files, not a second copy.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def unwrap(model: nn.Module) -> nn.Module:
    """The module under DDP / torch.compile wrappers."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        model = cast(nn.Module, inner)
    return model


def is_peft(model: nn.Module) -> bool:
    return hasattr(model, "peft_config")


@dataclass
class FullState:
    """Model and optimizer state to write; ``model`` is None when the module holds it whole."""

    model: dict[str, Tensor] | None
    optimizer: dict[str, Any]


def gather_full_state(model: nn.Module, optimizer: Optimizer | None, sharded: bool) -> FullState:
    """Under FSDP a collective (every rank calls it; rank 0 gets full CPU tensors)."""
    if not sharded:
        return FullState(None, optimizer.state_dict() if optimizer is not None else {})
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    optim = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer else {}
    return FullState(dict(get_model_state_dict(model, options=opts)), optim)  # type: ignore[arg-type]


def load_optimizer_state(
    model: nn.Module, optimizer: Optimizer, state: dict[str, Any], sharded: bool
) -> None:
    if sharded:
        opts = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=opts)
    else:
        optimizer.load_state_dict(state)


def save_weights(
    model: nn.Module,
    path: Path,
    tokenizer: Any = None,
    merged: bool = True,
    state_dict: dict[str, Tensor] | None = None,
) -> None:
    """Write an HF folder. A peft model writes its adapter, or (merged=True) full weights.

    ``state_dict`` (gathered from FSDP shards) replaces the module's own tensors.
    """
    model = unwrap(model)
    path.mkdir(parents=True, exist_ok=True)
    if is_peft(model) and merged:
        full = copy.deepcopy(model).merge_and_unload()  # type: ignore[operator]
        full.save_pretrained(path, safe_serialization=True)
    else:
        model.save_pretrained(path, safe_serialization=True, state_dict=state_dict)  # type: ignore[operator]
    if tokenizer is not None:
        tokenizer.save_pretrained(path)


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def optimizer_state_as(state: dict[str, Any], precision: str) -> dict[str, Any]:
    """``state`` with floating tensors in bf16 (``precision="bf16"``) or as it is.

    Optimizer.load_state_dict casts them back to the parameters' dtype on resume.
    """
    if precision == "fp32":
        return state

    def cast(value: Any) -> Any:
        if isinstance(value, Tensor) and value.is_floating_point() and value.dim() > 0:
            return value.to(torch.bfloat16)
        if isinstance(value, dict):
            return {key: cast(item) for key, item in value.items()}
        return value

    return {**state, "state": cast(state.get("state", {}))}


def save_checkpoint(
    save_dir: Path,
    step: int,
    model: nn.Module,
    full: FullState,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    tokenizer: Any = None,
    extra: dict[str, Any] | None = None,
    optimizer_precision: str = "fp32",
) -> Path:
    final = save_dir / f"step-{step}"
    tmp = save_dir / f".step-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_weights(model, tmp, tokenizer, merged=False, state_dict=full.model)
    state = {
        "step": step,
        "optimizer": optimizer_state_as(full.optimizer, optimizer_precision),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        **(extra or {}),
    }
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    logger.info("saved checkpoint %s", final)
    return final


def load_state(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path / STATE_FILE, map_location="cpu", weights_only=False)
    return state


def step_folders(folder: Path, marker: str | None = None) -> list[Path]:
    """The ``step-N`` folders in ``folder`` (with file ``marker`` in them), oldest first."""
    if not folder.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in folder.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (marker is None or (p / marker).is_file())
    ]
    return [path for _, path in sorted(found)]


def latest_checkpoint(save_dir: Path) -> Path | None:
    """The step-N folder with the highest N that has a complete trainer state."""
    found = step_folders(save_dir, STATE_FILE)
    return found[-1] if found else None


def resolve_resume(resume: str | None, save_dir: Path) -> Path | None:
    """'auto' -> latest checkpoint (or None to start fresh); a folder -> that folder."""
    if resume is None:
        return None
    if resume == "auto":
        return latest_checkpoint(save_dir)
    path = Path(resume)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"resume: {path} has no {STATE_FILE}; pass a step-N folder")
    return path


def prune_steps(folder: Path, keep: int | None, marker: str | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` step-N folders (None: keep all); returns the deleted."""
    if keep is None:
        return []
    old = step_folders(folder, marker)[:-keep]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    if old:
        logger.info("pruned %s (keeping the newest %d)", ", ".join(p.name for p in old), keep)
    return old


def write_pushed_weights(
    model: nn.Module,
    path: Path,
    tokenizer: Any,
    merged: bool,
    state_dict: dict[str, Tensor] | None,
    checkpoint: Path | None,
) -> None:
    """The folder pushed to inference servers: hard links to this step's ``checkpoint`` when it
    holds the same files (unless LoRA is merged for the push), else written out."""
    if checkpoint is not None and not (merged and is_peft(unwrap(model))):
        link_weights(checkpoint, path)
    else:
        save_weights(model, path, tokenizer, merged, state_dict=state_dict)


def link_weights(checkpoint: Path, path: Path) -> None:
    """``path`` gets the weight files of ``checkpoint`` as hard links (copies across devices)."""
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for source in checkpoint.iterdir():
        if source.is_file() and source.name != STATE_FILE:
            try:
                os.link(source, tmp / source.name)
            except OSError:
                shutil.copy2(source, tmp / source.name)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
