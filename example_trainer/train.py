"""GRPO trainer for atroposlib: register, pull, step, save, sync, acknowledge.

Variant: one optimizer step per broker batch (fully on-policy from the trainer's view); the
old policy of the PPO/GSPO ratio is the trainer's own logprobs at the start of the step, or
the batch's ``inference_logprobs`` (``loss.behavior_logprobs``). Advantages come from the batch
when an env sends them, else from scores (group mean or leave-one-out baseline; std scaling
per group, per batch or none; SPIRAL role baselines). Loss options (clip-higher, GSPO,
truncated importance sampling, KL k1/k3, entropy bonus, aggregation) are LossConfig switches;
see README.md. SFT rows (override ``sft``) are trained with plain NLL in the same step.

Micro-batches are packed rows by default (example_trainer.sequence_packing: whole sequences back to
back, block-diagonal attention, no padding), packed trees of sequences sharing their prompt
(example_trainer.prefix_sharing: each prompt computed once per group), or length-bucketed padded
rows.

Weights reach inference by disk reload, vLLM restart, LoRA hot-load, or the engines' native
in-flight updates (``weight_sync`` embedded / vllm / sglang, see ``inflight/``); a push that
fails on a server after its retries stops the run with one line naming the server.

Left out: several optimizer steps per batch (PPO epochs), value models.

Run: ``atropos-grpo --model FOLDER --batch-size 8`` or ``torchrun --nproc_per_node 2 -m
example_trainer.train ...``; rank 0 talks to the broker and broadcasts each batch.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from atroposlib.errors import BrokerError, BrokerUnavailableError, ConfigError
from atroposlib.utils.cli import configure_logging
from atroposlib.wire.broker import TrainerRegistration
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
from example_trainer.sequence_packing import (
    MicroBatchPlan,
    fp32_output_projection,
    micro_batch,
    micro_batch_plan,
    model_logprobs,
    student_distill_logprobs,
)
from example_trainer.sync_report import WeightSyncError
from example_trainer.tracking import Tracker, make_tracker
from example_trainer.weight_sync import WeightSync, push_weights, sync_for

logger = logging.getLogger("example_trainer")


class BatchSource(Protocol):
    """What the loop needs from the broker (atroposlib.client.TrainerClient fits)."""

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


# ---------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------


def train(cfg: TrainerConfig, client: BatchSource | None = None) -> list[dict[str, float]]:
    """Run ``cfg.num_steps`` steps (fewer if ``cfg.time_limit_s`` runs out); returns metrics."""
    rank, world, device = init_distributed()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)

    # ---- model, optimizer, schedule, resume -----------------------------------------------
    resume_from = resolve_resume(cfg.resume, cfg.save_dir)
    run = build_trainee(cfg, resume_from, device, world)
    start_step, role_baselines = resume_trainee(run, resume_from) if resume_from else (0, {})
    tracker = make_tracker(cfg, rank)

    # ---- broker and inference servers (rank 0 only) ---------------------------------------
    sync = sync_for(cfg)
    if rank == 0:
        client = register_trainer(cfg, client, start_step)
        if cfg.weight_sync == "vllm_restart":
            sync.start(str(resume_from or cfg.model))

    history: list[dict[str, float]] = []
    for step in range(start_step + 1, cfg.num_steps + 1):
        # ---- pull a batch and turn it into samples ----------------------------------------
        t0 = time.perf_counter()
        groups = broadcast(pull_groups(client, cfg.broker_patience_s, step), world)
        t_data = time.perf_counter() - t0

        # ---- forward / backward over micro-batches, then one optimizer step ----------------
        done = optimizer_step(cfg, run, groups, role_baselines, step, device)
        role_baselines = done.role_baselines
        t_trained = time.perf_counter()

        # ---- metrics ----------------------------------------------------------------------
        row: dict[str, float] = {
            "train/step": float(step),
            "train/lr": float(run.scheduler.get_last_lr()[0]),
            "train/grad_norm": done.grad_norm,
            "train/skipped": float(done.trained_tokens == 0),
            "train/data_wait_s": t_data,
            "time/forward_backward_s": done.forward_backward_s,
            "time/optimizer_s": done.optimizer_s,
            "time/train_s": t_trained - t0 - t_data,
            **loss_metrics(done.sums),
            **throughput_metrics(done.lengths, done.plan, time.perf_counter() - t0),
            **data_metrics(done.stats, done.lags, step),
            "train/elapsed_s": time.monotonic() - run.started,
        }
        final_step = step == cfg.num_steps or out_of_time(cfg, row, step, world)
        history.append(row)
        if rank == 0:
            tracker.log(row, step=step)
            log_step(step, row)

        # ---- save + acknowledge, then push weights ----------------------------------------
        t_save = time.perf_counter()
        checkpoint = save_and_ack(cfg, run, step, client, role_baselines, rank, world, final_step)
        after_step, failed = {"time/checkpoint_s": time.perf_counter() - t_save}, None
        if cfg.weight_sync != "none" and (step % cfg.sync_interval == 0 or final_step):
            metrics, failed = push_to_inference(
                cfg, run, sync, step, checkpoint, rank, world, final_step
            )
            after_step.update(metrics)
        after_step["time/step_end_unix_s"] = time.time()  # lines a profile up with other logs
        history[-1].update(after_step)
        if rank == 0:
            tracker.log(after_step, step=step)
        if failed is not None:  # on every rank, not only rank 0
            close_all(sync, tracker, client if rank == 0 else None)  # shm blocks too
            raise WeightSyncError(failed)
        if world > 1:
            dist.barrier()
        if final_step:
            break

    close_all(sync, tracker, client if rank == 0 else None)
    return history


# ---------------------------------------------------------------------------------------
# The steps of train(), in the order it calls them
# ---------------------------------------------------------------------------------------


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


@dataclass
class StepDone:
    """What one optimizer step computed: loss terms summed over ranks, and what it trained."""

    sums: dict[str, float]
    grad_norm: float
    forward_backward_s: float
    optimizer_s: float  # gradient clipping, AdamW, schedule
    trained_tokens: int
    lengths: list[int]  # the sequences that went through forward/backward
    plan: MicroBatchPlan
    stats: Any
    lags: np.ndarray  # (tokens,): updates between sampling and training
    role_baselines: dict[Any, float]


def optimizer_step(
    cfg: TrainerConfig,
    run: Trainee,
    groups: list[Any],
    role_baselines: dict[Any, float],
    step: int,
    device: torch.device,
) -> StepDone:
    """One GRPO step on a batch's groups: samples, micro-batches, gradients, AdamW, schedule."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    samples, role_baselines, stats = batch_to_samples(groups, cfg.loss, role_baselines)
    totals = batch_totals(samples)
    lags = version_lags(samples, step)
    # Sequences with nothing to train (zero-variance groups, masked rows) add 0 to the loss
    # and every metric: no forward/backward for them (one kept if none is left, for DDP).
    samples = [s for s in samples if s.trained_tokens > 0] or samples[:1]
    plan = micro_batch_plan(cfg, samples)
    mine = shard_plan(plan.entries, plan.costs, world, rank)
    n_micro = max(len(shard_plan(plan.entries, plan.costs, world, r)) for r in range(world))

    started = time.perf_counter()
    sums = forward_backward(cfg, run, samples, mine, n_micro, totals, world, device)
    backward_done = time.perf_counter()
    grad_norm = nn.utils.clip_grad_norm_(run.params, cfg.max_grad_norm)
    if totals.tokens > 0:  # an all-masked batch would still move AdamW's momentum
        run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return StepDone(
        summed_over_ranks(sums, world),
        float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm),
        backward_done - started,
        time.perf_counter() - backward_done,
        int(totals.tokens),
        [len(s.tokens) for s in samples],
        plan,
        stats,
        lags,
        role_baselines,
    )


def close_all(sync: WeightSync, tracker: Tracker, client: BatchSource | None) -> None:
    sync.close()
    tracker.finish()
    if client is not None:
        client.close()


def out_of_time(cfg: TrainerConfig, row: dict[str, float], step: int, world: int) -> bool:
    """Has ``cfg.time_limit_s`` run out by the end of this step? Rank 0's clock decides, so
    every rank stops at the same step."""
    over = cfg.time_limit_s is not None and row["train/elapsed_s"] >= cfg.time_limit_s
    if broadcast(over, world):
        logger.info("time limit of %.0f s reached after step %d", cfg.time_limit_s, step)
        return True
    return False


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


def pull_groups(client: BatchSource | None, patience_s: float, step: int) -> Any:
    """The groups of the next batch (rank 0; None on the other ranks, which get a broadcast)."""
    if client is None:
        return None
    batch = pull_batch(client, patience_s)
    if batch is None:
        return None
    if batch.step is not None and batch.step != step:
        logger.warning("broker sent batch for step %s while training step %d", batch.step, step)
    return batch.groups


def register_trainer(
    cfg: TrainerConfig, client: BatchSource | None, start_step: int
) -> BatchSource:
    if client is None:
        from atroposlib.client import TrainerClient

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
    return client


def forward_backward(
    cfg: TrainerConfig,
    run: Trainee,
    samples: list[Any],
    mine: list[Any],
    n_micro: int,
    totals: Any,
    world: int,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """Gradients of this rank's micro-batches; returns this rank's loss and metric sums."""
    model = run.model
    model.train()
    sums: dict[str, torch.Tensor] = {}
    loss_sum = torch.zeros((), device=device)
    for k in range(n_micro):
        dummy = k >= len(mine)  # keeps ranks in step for DDP's gradient all-reduce
        mb = micro_batch(cfg, samples, mine[k] if not dummy else None).to(device)
        last = k == n_micro - 1
        with grad_sync(model, enabled=last), autocast(cfg, device, model):
            logp, entropy = model_logprobs(model, mb, cfg.loss.entropy_coef > 0)  # (B, T-1)
            ref_logp = mb.ref_logprobs
            if ref_logp is None and cfg.loss.kl_coef > 0:
                ref_logp = reference_logprobs(model, run.ref_model, mb)
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
    return {"loss": loss_sum, **sums}


def summed_over_ranks(sums: dict[str, torch.Tensor], world: int) -> dict[str, float]:
    keys = ["loss", *sorted(k for k in sums if k != "loss")]
    packed = torch.stack([sums[k] for k in keys])
    if world > 1:
        dist.all_reduce(packed)
    return dict(zip(keys, packed.tolist(), strict=True))


def loss_metrics(total: dict[str, float]) -> dict[str, float]:
    """Per-token means of the loss terms summed over the batch."""

    def mean(key: str, per: str) -> float:
        return total[key] / max(total[per], 1.0)

    return {
        "train/loss": total["loss"],
        "train/entropy": mean("entropy", "tokens"),
        "train/clip_frac": mean("clip_frac", "rl_tokens"),
        "train/mismatch_kl": mean("mismatch_kl", "mismatch_tokens"),
        "train/is_weight": mean("is_weight", "rl_tokens"),
        "train/is_masked_frac": mean("is_masked", "tokens"),
        "train/ref_kl": mean("ref_kl", "rl_tokens"),
        "train/sft_nll": mean("sft_nll", "sft_tokens"),
        "train/distill_kl": mean("distill_kl", "tokens"),
        "train/trained_tokens": total["tokens"],
    }


def throughput_metrics(
    lengths: list[int], plan: MicroBatchPlan, elapsed: float
) -> dict[str, float]:
    seq_tokens = sum(lengths)
    return {
        "train/computed_tokens": float(seq_tokens),  # the sequences' tokens (all ranks)
        "train/forward_tokens": float(sum(plan.costs)),  # positions the forward computed
        "train/tokens_per_s": seq_tokens / elapsed,
        "train/padding_frac": 1.0 - plan.tokens / max(1, sum(plan.costs)),
    }


def data_metrics(stats: Any, lags: np.ndarray, step: int) -> dict[str, float]:
    """What the batch held: dropped groups, staleness, version lags, advantages, rewards."""
    staleness = [step - 1 - v for v in stats.policy_versions]
    return {
        "train/zero_variance_groups": float(stats.zero_variance_groups),
        "train/truncated_masked": float(stats.truncated_masked),
        "train/invalid_groups": float(stats.invalid_groups),
        "train/staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
        "train/staleness_max": float(max(staleness)) if staleness else 0.0,
        "train/version_lag_min": float(lags.min()) if lags.size else 0.0,
        "train/version_lag_mean": float(lags.mean()) if lags.size else 0.0,
        "train/version_lag_max": float(lags.max()) if lags.size else 0.0,
        **{f"train/advantage_{k}": float(v) for k, v in stats.advantage.items()},
        **{f"env/{env}/reward_mean": r for env, r in stats.rewards_by_env.items()},
    }


def log_step(step: int, row: dict[str, float]) -> None:
    logger.info(
        "step %d loss %.4f grad_norm %.3f entropy %.3f clip %.3f mismatch_kl %.2e tok/s %.0f "
        "version_lag mean %.2f max %.0f",
        step,
        row["train/loss"],
        row["train/grad_norm"],
        row["train/entropy"],
        row["train/clip_frac"],
        row["train/mismatch_kl"],
        row["train/tokens_per_s"],
        row["train/version_lag_mean"],
        row["train/version_lag_max"],
    )


def save_and_ack(
    cfg: TrainerConfig,
    run: Trainee,
    step: int,
    client: BatchSource | None,
    role_baselines: dict[Any, float],
    rank: int,
    world: int,
    final_step: bool,
) -> Path | None:
    """Checkpoint (every rank gathers, rank 0 writes), then tell the broker it is trained; only
    every ``cfg.save_interval`` steps and at the last step (None otherwise)."""
    if step % cfg.save_interval != 0 and not final_step:
        return None
    checkpoint = None
    full = gather_full_state(run.model, run.optimizer, run.sharded)  # collective under FSDP
    if rank == 0:
        checkpoint = save_checkpoint(
            cfg.save_dir,
            step,
            run.model,
            full,
            run.scheduler,
            run.tokenizer,
            extra={"role_baselines": role_baselines, "config": cfg.model_dump(mode="json")},
            optimizer_precision=cfg.checkpoint_optimizer_precision,
        )
        client.ack(step)  # type: ignore[union-attr]
        prune_steps(cfg.save_dir, cfg.keep_last_checkpoints, marker=STATE_FILE)
    if world > 1:
        dist.barrier()
    return checkpoint


def push_to_inference(
    cfg: TrainerConfig,
    run: Trainee,
    sync: Any,
    step: int,
    checkpoint: Path | None,
    rank: int,
    world: int,
    final: bool = False,
) -> tuple[dict[str, float], Any]:
    """Push the new weights (rank 0); returns the push's metrics and, on every rank, the
    failed report (None when the push worked). The final weights are also left as a folder
    when the push sent tensors (hard links to the final checkpoint's files)."""
    weights = gather_full_state(run.model, None, run.sharded).model  # collective under FSDP
    failed, metrics = None, {}
    if rank == 0:
        folder = cfg.save_dir / "weights" / f"step-{step}"
        merged = sync.writes != "adapter"
        write = partial(
            write_pushed_weights, run.model, folder, run.tokenizer, merged, weights, checkpoint
        )
        written_s: list[float] = []

        def timed_write() -> None:
            started = time.perf_counter()
            write()
            written_s.append(time.perf_counter() - started)

        report = push_weights(sync, run.model, weights, folder, timed_write, step)
        if final and checkpoint is not None and not folder.exists():
            timed_write()
        metrics = {**report.metrics(), "sync/write_seconds": sum(written_s)}
        failed = report if report.failed else None
        prune_steps(cfg.save_dir / "weights", cfg.keep_last_weights)
    return metrics, broadcast(failed, world)


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

    Same forward as the policy's (packed rows, prefix-shared trees or padded rows).
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
