"""What a step hands on: a checkpoint the broker is told is trained, then weights for inference."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist

from example_trainer.checkpoint import (
    STATE_FILE,
    gather_full_state,
    prune_steps,
    save_checkpoint,
    write_pushed_weights,
)
from example_trainer.config import TrainerConfig
from example_trainer.distributed import broadcast
from example_trainer.trainee import Trainee
from example_trainer.weight_sync import push_weights


class Acknowledges(Protocol):
    """The broker client's ``ack`` (atroposlib.client.TrainerClient fits)."""

    def ack(self, step: int) -> Any: ...


def save_and_ack(
    cfg: TrainerConfig,
    run: Trainee,
    step: int,
    client: Acknowledges | None,
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
