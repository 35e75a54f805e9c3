"""What a run leaves on disk: the newest checkpoints and pushed weights, one copy of each file."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from trainer_helpers import ListClient, base_args, fixed, make_batch

from example_trainer.checkpoint import STATE_FILE, optimizer_state_as, prune_steps
from example_trainer.config import load_config
from example_trainer.train import train


def test_prune_steps_keeps_the_newest_by_number(tmp_path: Path) -> None:
    for step in (2, 9, 10, 11):
        (tmp_path / f"step-{step}").mkdir()
        (tmp_path / f"step-{step}" / STATE_FILE).write_bytes(b"x")
    (tmp_path / "step-12").mkdir()  # no trainer state: not a checkpoint, never pruned as one
    (tmp_path / ".step-13.tmp").mkdir()
    (tmp_path / "weights").mkdir()
    assert prune_steps(tmp_path, None, marker=STATE_FILE) == []
    deleted = prune_steps(tmp_path, 2, marker=STATE_FILE)
    assert sorted(p.name for p in deleted) == ["step-2", "step-9"]  # 9 < 10 < 11 as numbers
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".step-13.tmp", "step-10", "step-11", "step-12", "weights",
    ]  # fmt: skip


def test_bf16_optimizer_state_halves_the_moments_and_loads_back_as_fp32() -> None:
    param = torch.nn.Parameter(torch.randn(64))
    optimizer = torch.optim.AdamW([param], lr=1e-2)
    param.grad = torch.randn(64)
    optimizer.step()
    state = optimizer.state_dict()
    small = optimizer_state_as(state, "bf16")
    moments = small["state"][0]
    assert moments["exp_avg"].dtype == torch.bfloat16 and moments["exp_avg_sq"].dtype == (
        torch.bfloat16
    )
    assert moments["step"].dtype == state["state"][0]["step"].dtype  # the step count is exact
    assert optimizer_state_as(state, "fp32") is state
    restored = torch.optim.AdamW([param], lr=1e-2)
    restored.load_state_dict(small)
    exp_avg = restored.state_dict()["state"][0]["exp_avg"]
    assert exp_avg.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa: relative error at most 2^-8 per value
    torch.testing.assert_close(exp_avg, state["state"][0]["exp_avg"], rtol=2**-8, atol=0)


@pytest.mark.slow
def test_a_run_keeps_the_last_checkpoint_and_links_the_final_weights(
    fake_server: Callable[..., str], tiny_model: Path, tmp_path: Path
) -> None:
    url = fake_server()
    keep = ["--keep-last-checkpoints", "1", "--keep-last-weights", "1"]
    sync = ["--weight-sync", "disk", "--inference-urls", f'["{url}"]']
    args = base_args(tiny_model, tmp_path, "--num-steps", "4", "--save-interval", "2", *keep)
    args += [*sync, "--checkpoint-optimizer-precision", "bf16"]
    train(load_config(args), ListClient(fixed(make_batch(seed=9))))

    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-4", "weights"]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["step-4"]
    checkpoint, final = tmp_path / "step-4", tmp_path / "weights" / "step-4"
    assert httpx.get(url + "/health").json()["model_path"] == str(final.resolve())
    # the final weights are the checkpoint's files, hard-linked: on disk once
    assert (final / "model.safetensors").stat().st_ino == (
        checkpoint / "model.safetensors"
    ).stat().st_ino
    assert not (final / STATE_FILE).exists()
    state = torch.load(checkpoint / STATE_FILE, weights_only=False)
    moments = [t for s in state["optimizer"]["state"].values() for t in s.values() if t.dim()]
    assert moments and all(t.dtype == torch.bfloat16 for t in moments)

    resumed = ListClient(fixed(make_batch(seed=9)))
    more = train(load_config([*args, "--num-steps", "5", "--resume", "auto"]), resumed)
    assert resumed.registrations[0].starting_step == 4 and math.isfinite(more[0]["train/loss"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-5", "weights"]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["step-5"]
