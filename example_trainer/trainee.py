"""The model being trained: loading (full or LoRA), optimizer and schedule, resume, precision."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from example_trainer.checkpoint import load_optimizer_state, load_state, set_rng_state
from example_trainer.config import TrainerConfig
from example_trainer.distributed import shard_model
from example_trainer.sequence_packing import fp32_output_projection

logger = logging.getLogger(__name__)


@dataclass
class Trainee:
    """The model being trained and what steps it: optimizer, schedule, reference model."""

    model: nn.Module  # wrapped in DDP when world > 1 (FSDP shards it in place)
    ref_model: nn.Module | None
    tokenizer: Any
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sharded: bool
    started: float
    """``time.monotonic()`` before the model was loaded: the time limit counts from it."""


def build_trainee(
    cfg: TrainerConfig, resume_from: Path | None, device: torch.device, world: int
) -> Trainee:
    started = time.monotonic()
    model = load_model(cfg, resume_from, device)
    tokenizer = load_tokenizer(cfg.model)
    ref_model: nn.Module | None = None
    if cfg.loss.kl_coef > 0 and not cfg.lora.enabled:  # LoRA: reference = adapters disabled
        from transformers import AutoModelForCausalLM

        ref_name = cfg.ref_model or cfg.model
        ref: Any = AutoModelForCausalLM.from_pretrained(ref_name, dtype=torch.float32)
        ref_model = ref.to(device).requires_grad_(False).eval()
    sharded = cfg.parallel == "fsdp" and dist.is_initialized()  # torchrun, one rank included
    if sharded:
        shard_model(model)
    elif world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    params = [p for p in model.parameters() if p.requires_grad]
    # fused: one kernel over every parameter (a 135M model's AdamW step on a CPU core: 0.6 s
    # foreach -> 0.15 s); DTensor parameters of a sharded model keep the foreach update
    optimizer = torch.optim.AdamW(
        params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=not sharded or None
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    return Trainee(model, ref_model, tokenizer, params, optimizer, scheduler, sharded, started)


def resume_trainee(run: Trainee, resume_from: Path) -> tuple[int, dict[Any, float]]:
    """Optimizer, schedule and RNG state of a checkpoint; returns (step, role baselines)."""
    state = load_state(resume_from)
    load_optimizer_state(run.model, run.optimizer, state["optimizer"], run.sharded)
    run.scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    logger.info("resumed from %s at step %d", resume_from, state["step"])
    return state["step"], state.get("role_baselines", {})


def load_model(cfg: TrainerConfig, resume_from: Path | None, device: torch.device) -> nn.Module:
    from transformers import AutoModelForCausalLM

    weights = resume_from if (resume_from is not None and not cfg.lora.enabled) else cfg.model
    model: Any = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32)
    model.config.use_cache = False
    if cfg.lora.enabled:
        from peft import LoraConfig, PeftModel, get_peft_model

        if resume_from is not None:
            model = PeftModel.from_pretrained(model, str(resume_from), is_trainable=True)
        else:
            lora = LoraConfig(
                r=cfg.lora.r,
                lora_alpha=cfg.lora.alpha,
                lora_dropout=cfg.lora.dropout,
                target_modules=cfg.lora.target_modules,
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, lora)
    if cfg.gradient_checkpointing:
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False}
        )
    return model.to(device)


def load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        logger.info("no tokenizer at %s (%s); checkpoints will carry weights only", name, exc)
        return None


def lr_lambda(cfg: TrainerConfig) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = (step - cfg.warmup_steps) / max(1, cfg.num_steps - cfg.warmup_steps)
        shape = (
            1.0 - progress if cfg.lr_schedule == "linear" else 0.5 * (1 + np.cos(np.pi * progress))
        )
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * float(shape)

    return factor


def autocast(
    cfg: TrainerConfig, device: torch.device, model: nn.Module | None = None
) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast when the precision asks for it; with ``cfg.fp32_logits`` the model's
    output projection stays in fp32 inside it."""
    bf16 = cfg.precision == "bf16" or (
        cfg.precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    if not bf16:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast(device_type=device.type, dtype=torch.bfloat16))
    if cfg.fp32_logits and model is not None:
        stack.enter_context(fp32_output_projection(model))
    return stack
