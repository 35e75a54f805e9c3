"""torchrun with 2 CPU processes (gloo) gives the parameters of 1 process on the same data."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_helpers import ListClient, base_args, make_batch, state_dict_of

from example_trainer.config import load_config
from example_trainer.data import batch_to_samples
from example_trainer.sequence_packing import micro_batch_plan
from example_trainer.train import train

WORKER = Path(__file__).parent / "ddp_worker.py"


def torchrun(subprocess_env: dict[str, str], *args: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*cmd, str(WORKER), *args], env=subprocess_env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one_process(
    parallel: str, tiny_model: Path, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    single = tmp_path / "single"
    three_rows = ["--micro-batch-tokens", "64"]  # 3 micro-batches: one rank runs a dummy too
    args = base_args(tiny_model, single, "--num-steps", "2", "--save-interval", "1", *three_rows)
    cfg = load_config(args)
    assert cfg.micro_batching == "packed"  # the default is what runs under torchrun too
    for step in (1, 2):
        samples = batch_to_samples(make_batch(seed=200 + step), cfg.loss)[0]
        assert len(micro_batch_plan(cfg, samples).entries) == 3
    train(cfg, ListClient(lambda step: make_batch(seed=200 + step)))
    multi = tmp_path / parallel
    torchrun(subprocess_env, str(tiny_model), str(multi), "2", "--parallel", parallel, *three_rows)
    a, b = state_dict_of(single / "step-2"), state_dict_of(multi / "step-2")
    start = state_dict_of(tiny_model)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=0)
    assert max((a[k] - start[k]).abs().max().item() for k in a) > 1e-3  # it did train
    if parallel == "fsdp":  # resume from a gathered FSDP checkpoint, still under FSDP
        shutil.rmtree(multi / "step-2")
        torchrun(subprocess_env, str(tiny_model), str(multi), "2", "--parallel", parallel,
                 *three_rows, "--resume", "auto")  # fmt: skip
        resumed = state_dict_of(multi / "step-2")
        for key in a:
            torch.testing.assert_close(a[key], resumed[key], atol=1e-5, rtol=0)
