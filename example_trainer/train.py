"""GRPO trainer for atroposlib: register, pull, step, save, sync, acknowledge.

Variant: one optimizer step per broker batch (fully on-policy from the trainer's view); the
old policy of the PPO/GSPO ratio is the trainer's own logprobs at the start of the step, or
the batch's ``inference_logprobs`` (``loss.behavior_logprobs``). Advantages come from the batch
when an env sends them, else from scores (group mean or leave-one-out baseline; std scaling
per group, per batch or none; SPIRAL role baselines). Loss options (clip-higher, GSPO,
truncated importance sampling, KL k1/k3, entropy bonus, aggregation) are LossConfig switches;
see README.md. SFT rows (override ``sft``) are trained with plain NLL in the same step.

Micro-batches are packed rows by default (example_trainer.packing: whole sequences back to
back, block-diagonal attention, no padding) or length-bucketed padded rows.

Weights reach inference by disk reload, vLLM restart, LoRA hot-load, or the engines' native
in-flight updates (``weight_sync`` embedded / vllm / sglang, see ``inflight/``); a push that
fails on a server after its retries stops the run with one line naming the server.

Left out: several optimizer steps per batch (PPO epochs), value models.

Run: ``atropos-grpo --model FOLDER --batch_size 8`` or ``torchrun --nproc_per_node 2 -m
example_trainer.train ...``; rank 0 talks to the broker and broadcasts each batch.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from atroposlib.errors import BrokerError, BrokerUnavailableError, ConfigError
from atroposlib.protocol import TrainerRegistration
from atroposlib.utils.cli import configure_logging
from example_trainer.checkpoint import (
    STATE_FILE,
    gather_full_state,
    load_optimizer_state,
    load_state,
    prune_steps,
    resolve_resume,
    save_checkpoint,
    set_rng_state,
    unwrap,
    write_pushed_weights,
)
from example_trainer.config import TrainerConfig, load_config
from example_trainer.data import batch_to_samples, batch_totals, shard_plan, version_lags
from example_trainer.distributed import broadcast, grad_sync, init_distributed, shard_model
from example_trainer.loss import LossInputs, grpo_loss
from example_trainer.packing import (
    micro_batch,
    micro_batch_plan,
    model_logprobs,
    student_distill_logprobs,
)
from example_trainer.sync_report import WeightSyncError
from example_trainer.tracking import make_tracker
from example_trainer.weight_sync import push_weights, sync_for

logger = logging.getLogger("example_trainer")


class BatchSource(Protocol):
    """What the loop needs from the broker (atroposlib.api.client.TrainerClient fits)."""

    def register(self, registration: TrainerRegistration) -> int: ...
    def wait_for_batch(self, poll_interval: float = 0.5, timeout: float | None = None) -> Any: ...
    def ack(self, step: int) -> Any: ...
    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------
# Setup helpers
# ---------------------------------------------------------------------------------------


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


def autocast(cfg: TrainerConfig, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    bf16 = cfg.precision == "bf16" or (
        cfg.precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------


def train(cfg: TrainerConfig, client: BatchSource | None = None) -> list[dict[str, float]]:
    """Run ``cfg.num_steps`` steps (from the resumed step), or fewer when ``cfg.time_limit_s``
    runs out; returns each step's metrics."""
    started = time.monotonic()
    rank, world, device = init_distributed()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)

    # ---- model, optimizer, schedule, resume -----------------------------------------------
    resume_from = resolve_resume(cfg.resume, cfg.save_dir)
    model = load_model(cfg, resume_from, device)
    tokenizer = load_tokenizer(cfg.model)
    ref_model: nn.Module | None = None
    if cfg.loss.kl_coef > 0 and not cfg.lora.enabled:  # LoRA: reference = adapters disabled
        from transformers import AutoModelForCausalLM

        ref_name = cfg.ref_model or cfg.model
        ref: Any = AutoModelForCausalLM.from_pretrained(ref_name, dtype=torch.float32)
        ref_model = ref.to(device).requires_grad_(False).eval()
    sharded = world > 1 and cfg.parallel == "fsdp"
    if sharded:
        shard_model(model)
    elif world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    start_step, role_baselines = 0, {}
    if resume_from is not None:
        state = load_state(resume_from)
        load_optimizer_state(model, optimizer, state["optimizer"], sharded)
        scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        start_step, role_baselines = state["step"], state.get("role_baselines", {})
        logger.info("resumed from %s at step %d", resume_from, start_step)
    tracker = make_tracker(cfg, rank)

    # ---- broker and inference servers (rank 0 only) ---------------------------------------
    sync = sync_for(cfg)
    if rank == 0:
        if client is None:
            from atroposlib.api.client import TrainerClient

            key = cfg.broker_api_key.get_secret_value() if cfg.broker_api_key else None
            client = TrainerClient(cfg.broker_url, key)
        client.register(
            TrainerRegistration(
                wandb_group=cfg.wandb.group or "",
                wandb_project=cfg.wandb.project,
                batch_size=cfg.batch_size,
                max_token_len=cfg.max_token_len,
                checkpoint_dir=str(cfg.save_dir),
                save_checkpoint_interval=cfg.save_interval,
                starting_step=start_step,
                num_steps=cfg.num_steps,
                max_staleness=cfg.max_staleness,
                acknowledges=True,
            )
        )
        if cfg.weight_sync == "vllm_restart":
            sync.start(str(resume_from or cfg.model))

    history: list[dict[str, float]] = []
    for step in range(start_step + 1, cfg.num_steps + 1):
        # ---- pull a batch and turn it into samples ----------------------------------------
        t0 = time.perf_counter()
        batch = pull_batch(client, cfg.broker_patience_s) if client is not None else None
        groups = broadcast(batch.groups if batch is not None else None, world)
        if batch is not None and batch.step is not None and batch.step != step:
            logger.warning("broker sent batch for step %s while training step %d", batch.step, step)
        t_data = time.perf_counter() - t0
        samples, role_baselines, stats = batch_to_samples(groups, cfg.loss, role_baselines)
        totals = batch_totals(samples)
        lags = version_lags(samples, step)  # (tokens,): updates between sampling and training
        # Sequences with nothing to train (zero-variance groups, masked rows) add 0 to the loss
        # and every metric: no forward/backward for them (one kept if none is left, for DDP).
        samples = [s for s in samples if s.trained_tokens > 0] or samples[:1]
        lengths = [len(s.tokens) for s in samples]
        plan, costs = micro_batch_plan(cfg, lengths)
        mine = shard_plan(plan, costs, world, rank)
        n_micro = max(len(shard_plan(plan, costs, world, r)) for r in range(world))

        # ---- forward / backward over micro-batches ----------------------------------------
        model.train()
        sums: dict[str, torch.Tensor] = {}
        loss_sum = torch.zeros((), device=device)
        for k in range(n_micro):
            dummy = k >= len(mine)  # keeps ranks in step for DDP's gradient all-reduce
            mb = micro_batch(cfg, samples, mine[k] if not dummy else None).to(device)
            last = k == n_micro - 1
            with grad_sync(model, enabled=last), autocast(cfg, device):
                logp, entropy = model_logprobs(model, mb, cfg.loss.entropy_coef > 0)  # (B, T-1)
                ref_logp = mb.ref_logprobs
                if ref_logp is None and cfg.loss.kl_coef > 0:
                    ref_logp = reference_logprobs(model, ref_model, mb)
                x = LossInputs(
                    **distill_inputs(model, mb, cfg),
                    logp=logp,
                    entropy=entropy,
                    mask=mb.mask * (0.0 if dummy else 1.0),
                    advantages=mb.advantages,
                    sft=mb.sft,
                    inference_logp=mb.inference_logprobs,
                    has_inference=mb.has_inference,
                    ref_logp=ref_logp,
                )
                loss, metrics = grpo_loss(x, cfg.loss, totals, cfg.constant_normalizer)
                (loss * world).backward()  # DDP averages gradients over ranks; we want the sum
            loss_sum += loss.detach()
            for key, value in metrics.items():
                sums[key] = sums.get(key, torch.zeros((), device=device)) + value
        grad_norm = nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        if totals.tokens > 0:  # an all-masked batch would still move AdamW's momentum
            optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        # ---- metrics ----------------------------------------------------------------------
        keys = sorted(sums)
        packed = torch.stack([loss_sum, *(sums[k] for k in keys)])
        if world > 1:
            dist.all_reduce(packed)
        total = dict(zip(["loss", *keys], packed.tolist(), strict=True))
        elapsed = time.perf_counter() - t0
        out_of_time = broadcast(
            cfg.time_limit_s is not None and time.monotonic() - started >= cfg.time_limit_s, world
        )  # rank 0's clock decides, so every rank stops at the same step
        seq_tokens = sum(lengths)
        staleness = [step - 1 - v for v in stats.policy_versions]
        row = {
            "train/step": float(step),
            "train/loss": total["loss"],
            "train/lr": scheduler.get_last_lr()[0],
            "train/grad_norm": float(grad_norm),
            "train/entropy": total["entropy"] / max(total["tokens"], 1.0),
            "train/clip_frac": total["clip_frac"] / max(total["rl_tokens"], 1.0),
            "train/mismatch_kl": total["mismatch_kl"] / max(total["mismatch_tokens"], 1.0),
            "train/is_weight": total["is_weight"] / max(total["rl_tokens"], 1.0),
            "train/is_masked_frac": total["is_masked"] / max(total["tokens"], 1.0),
            "train/ref_kl": total["ref_kl"] / max(total["rl_tokens"], 1.0),
            "train/sft_nll": total["sft_nll"] / max(total["sft_tokens"], 1.0),
            "train/distill_kl": total["distill_kl"] / max(total["tokens"], 1.0),
            "train/trained_tokens": total["tokens"],
            "train/skipped": float(totals.tokens == 0),
            "train/computed_tokens": float(seq_tokens),  # through the model (this rank)
            "train/tokens_per_s": seq_tokens / elapsed,
            "train/padding_frac": 1.0 - seq_tokens / max(1, sum(costs)),
            "train/data_wait_s": t_data,
            "train/zero_variance_groups": float(stats.zero_variance_groups),
            "train/truncated_masked": float(stats.truncated_masked),
            "train/invalid_groups": float(stats.invalid_groups),
            "train/staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
            "train/staleness_max": float(max(staleness)) if staleness else 0.0,
            "train/version_lag_min": float(lags.min()) if lags.size else 0.0,
            "train/version_lag_mean": float(lags.mean()) if lags.size else 0.0,
            "train/version_lag_max": float(lags.max()) if lags.size else 0.0,
            "train/elapsed_s": time.monotonic() - started,
            **{f"train/advantage_{k}": float(v) for k, v in stats.advantage.items()},
            **{f"env/{env}/reward_mean": r for env, r in stats.rewards_by_env.items()},
        }
        history.append(row)
        if rank == 0:
            tracker.log(row, step=step)
            logger.info(
                "step %d loss %.4f grad_norm %.3f entropy %.3f clip %.3f mismatch_kl %.2e "
                "tok/s %.0f",
                step,
                row["train/loss"],
                row["train/grad_norm"],
                row["train/entropy"],
                row["train/clip_frac"],
                row["train/mismatch_kl"],
                row["train/tokens_per_s"],
            )

        # ---- save + acknowledge, then push weights ----------------------------------------
        checkpoint = None
        final_step = step == cfg.num_steps or out_of_time
        if step % cfg.save_interval == 0 or final_step:
            full = gather_full_state(model, optimizer, sharded)  # collective under FSDP
            if rank == 0:
                checkpoint = save_checkpoint(
                    cfg.save_dir,
                    step,
                    model,
                    full,
                    scheduler,
                    tokenizer,
                    extra={"role_baselines": role_baselines, "config": cfg.model_dump(mode="json")},
                    optimizer_precision=cfg.checkpoint_optimizer_precision,
                )
                client.ack(step)  # type: ignore[union-attr]
                prune_steps(cfg.save_dir, cfg.keep_last_checkpoints, marker=STATE_FILE)
            if world > 1:
                dist.barrier()
        if cfg.weight_sync != "none" and (step % cfg.sync_interval == 0 or final_step):
            weights = gather_full_state(model, None, sharded).model  # collective under FSDP
            failed = None
            if rank == 0:
                folder = cfg.save_dir / "weights" / f"step-{step}"
                merged = sync.writes != "adapter"
                write = partial(
                    write_pushed_weights, model, folder, tokenizer, merged, weights, checkpoint
                )
                report = push_weights(sync, model, weights, folder, write, step)
                tracker.log(report.metrics(), step=step)
                history[-1].update(report.metrics())
                failed = report if report.failed else None
                prune_steps(cfg.save_dir / "weights", cfg.keep_last_weights)
            failed = broadcast(failed, world)  # every rank stops, not only rank 0
            if failed is not None:
                raise WeightSyncError(failed)
        if world > 1:
            dist.barrier()
        if out_of_time:
            logger.info("time limit of %.0f s reached after step %d", cfg.time_limit_s, step)
            break

    sync.close()
    tracker.finish()
    if rank == 0 and client is not None:
        client.close()
    return history


def pull_batch(client: BatchSource, patience_s: float) -> Any:
    """The next batch; broker outages are waited out (with backoff) for up to patience_s."""
    deadline, delay = time.monotonic() + patience_s, 1.0
    while True:
        try:
            return client.wait_for_batch()
        except BrokerUnavailableError as exc:
            if time.monotonic() + delay > deadline:
                raise
            logger.warning("broker unavailable (%s); retrying in %.0f s", exc, delay)
            time.sleep(delay)
            delay = min(delay * 2, 30.0)


def distill_inputs(model: nn.Module, mb: Any, cfg: TrainerConfig) -> dict[str, torch.Tensor]:
    """The student's and teacher's top-k logprobs when the batch carries a teacher's."""
    if cfg.loss.distill_coef <= 0 or mb.distill_ids is None:
        return {}
    return {
        "distill_student": student_distill_logprobs(model, mb),  # (B, T-1, K)
        "distill_teacher": mb.distill_logprobs,
        "distill_valid": mb.distill_ids >= 0,
    }


def reference_logprobs(model: nn.Module, ref_model: nn.Module | None, mb: Any) -> torch.Tensor:
    """Reference logprobs (B, T-1): the frozen model, or the LoRA base with adapters off.

    Same forward as the policy's (packed row or padded rows).
    """
    with torch.no_grad():
        if ref_model is not None:
            return model_logprobs(ref_model, mb)[0]
        peft_model = unwrap(model)  # no DDP hooks for a forward without backward
        with peft_model.disable_adapter():  # type: ignore[operator]
            return model_logprobs(peft_model, mb)[0]


def main(argv: list[str] | None = None) -> int:
    configure_logging(logging.INFO)
    try:
        cfg = load_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"atropos-grpo: error: {exc}", file=sys.stderr)
        return 2
    try:
        train(cfg)
    except BrokerError as exc:  # unreachable or refusing broker: one line, not a traceback
        logger.error("%s (broker_url=%s)", exc, cfg.broker_url)
        return 1
    except WeightSyncError as exc:  # a server did not take new weights: one line naming it
        logger.error("%s", exc)
        return 1
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
