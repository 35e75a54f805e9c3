"""torchrun with 2 CPU processes (gloo) gives the parameters of 1 process on the same data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_helpers import ListClient, base_args, make_batch, state_dict_of

from example_trainer.config import load_config
from example_trainer.train import train

WORKER = Path(__file__).parent / "ddp_worker.py"


@pytest.mark.slow
def test_two_process_ddp_matches_one_process(
    tiny_model: Path, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    steps = "2"
    single = tmp_path / "single"
    train(
        load_config(base_args(tiny_model, single, "--num_steps", steps, "--save_interval", steps)),
        ListClient(lambda step: make_batch(seed=200 + step)),
    )
    ddp = tmp_path / "ddp"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(WORKER), str(tiny_model), str(ddp), steps,
    ]  # fmt: skip
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    a, b = state_dict_of(single / "step-2"), state_dict_of(ddp / "step-2")
    start = state_dict_of(tiny_model)
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=0)
    assert max((a[k] - start[k]).abs().max().item() for k in a) > 1e-3  # it did train
