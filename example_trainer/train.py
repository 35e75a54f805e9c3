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

Reading order: ``train()`` is the loop, its steps follow in the order it calls them; the model,
optimizer and resume are in ``trainee.py``, metric rows in ``metrics.py``, checkpoint + ack and
the weight push in ``publish.py``.

Left out: several optimizer steps per batch (PPO epochs), value models.

Run: ``atropos-grpo --model FOLDER --batch-size 8`` or ``torchrun --nproc_per_node 2 -m
example_trainer.train ...``; rank 0 talks to the broker and broadcasts each batch.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from atroposlib.errors import BrokerError, BrokerUnavailableError, ConfigError
from atroposlib.utils.cli import configure_logging
from atroposlib.wire.broker import TrainerRegistration
from example_trainer.checkpoint import resolve_resume, unwrap
from example_trainer.config import TrainerConfig, load_config
from example_trainer.data import batch_to_samples, batch_totals, shard_plan, version_lags
from example_trainer.distributed import broadcast, grad_sync, init_distributed, summed_over_ranks
from example_trainer.loss import LossInputs, grpo_loss
from example_trainer.metrics import data_metrics, loss_metrics, throughput_metrics
from example_trainer.publish import push_to_inference, save_and_ack
from example_trainer.sequence_packing import (
    MicroBatchPlan,
    micro_batch,
    micro_batch_plan,
    model_logprobs,
    student_distill_logprobs,
)
from example_trainer.sync_report import WeightSyncError
from example_trainer.tracking import Tracker, make_tracker
from example_trainer.trainee import Trainee, autocast, build_trainee, resume_trainee
from example_trainer.weight_sync import WeightSync, sync_for

logger = logging.getLogger("example_trainer")


class BatchSource(Protocol):
    """What the loop needs from the broker (atroposlib.client.TrainerClient fits)."""

    def register(self, registration: TrainerRegistration) -> int: ...
    def wait_for_batch(self, poll_interval: float = 0.5, timeout: float | None = None) -> Any: ...
    def ack(self, step: int) -> Any: ...
    def close(self) -> None: ...


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


def distill_inputs(model: nn.Module, mb: Any, cfg: TrainerConfig) -> dict[str, torch.Tensor]:
    """The student's and teacher's top-k logprobs when the batch carries a teacher's."""
    if cfg.loss.distill_coef <= 0 or mb.distill_ids is None:
        return {}
    return {
        "distill_student": student_distill_logprobs(model, mb),  # (B, T-1, K)
        "distill_teacher": mb.distill_logprobs,
        "distill_valid": mb.distill_ids >= 0,
    }


def out_of_time(cfg: TrainerConfig, row: dict[str, float], step: int, world: int) -> bool:
    """Has ``cfg.time_limit_s`` run out by the end of this step? Rank 0's clock decides, so
    every rank stops at the same step."""
    over = cfg.time_limit_s is not None and row["train/elapsed_s"] >= cfg.time_limit_s
    if broadcast(over, world):
        logger.info("time limit of %.0f s reached after step %d", cfg.time_limit_s, step)
        return True
    return False


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


def close_all(sync: WeightSync, tracker: Tracker, client: BatchSource | None) -> None:
    sync.close()
    tracker.finish()
    if client is not None:
        client.close()


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


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
