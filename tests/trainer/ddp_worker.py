"""Run by torchrun in test_trainer_ddp.py: train on the fixed test batches, every rank."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from trainer_helpers import ListClient, base_args, make_batch

from example_trainer.config import load_config
from example_trainer.train import train


def main() -> None:
    model, save_dir, steps, *extra = Path(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:]
    args = base_args(model, save_dir, "--num-steps", steps, "--save-interval", "1", *extra)
    cfg = load_config(args)
    client = ListClient(lambda step: make_batch(seed=200 + step))
    train(cfg, client if int(os.environ.get("RANK", "0")) == 0 else None)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
