"""The training loop on the tiny model: learning, SFT, micro-batching, resume, LoRA, KL."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from float_bounds import assert_same_first_adamw_step, gradient_error
from trainer_helpers import (
    ListClient,
    base_args,
    fixed,
    make_batch,
    make_group,
    state_dict_of,
    with_model_logprobs,
)

from example_trainer.config import load_config
from example_trainer.train import train


def test_steps_on_a_fixed_batch_lower_the_loss(tiny_model: Path, tmp_path: Path) -> None:
    batch = with_model_logprobs(tiny_model, make_batch(seed=1))
    args = base_args(tiny_model, tmp_path, "--num-steps", "6", "--save-interval", "100")
    cfg = load_config([*args, "--loss.behavior-logprobs", "inference", "--lr", "3e-3"])
    client = ListClient(fixed(batch))
    history = train(cfg, client)
    losses = [row["train/loss"] for row in history]
    assert losses[-1] < losses[0] - 0.05, losses
    assert history[0]["train/mismatch_kl"] == pytest.approx(0.0, abs=1e-6)  # on-policy start
    assert history[-1]["train/mismatch_kl"] > 1e-4  # the policy moved away from the sampler
    assert client.acks == [6] and client.registrations[0].acknowledges


def test_sft_rows_train_with_plain_nll(tiny_model: Path, tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(5)
    groups = [make_group(rng, [1.0], group_overrides={"sft": True}) for _ in range(3)]
    groups = with_model_logprobs(tiny_model, groups)  # the model's own logprobs = -NLL
    nll = [-lp[6:] for g in groups for lp in g["inference_logprobs"]]  # prompt_len 6
    expected = float(np.concatenate(nll).mean())
    cfg = load_config(base_args(tiny_model, tmp_path, "--num-steps", "2", "--batch-size", "3"))
    history = train(cfg, ListClient(fixed(groups)))
    assert history[0]["train/loss"] == pytest.approx(expected, rel=1e-4)
    assert history[0]["train/sft_nll"] == pytest.approx(expected, rel=1e-4)
    assert history[1]["train/loss"] < history[0]["train/loss"]  # NLL went down


def test_micro_batching_does_not_change_the_update(tiny_model: Path, tmp_path: Path) -> None:
    batch = make_batch(seed=2)
    outs = []
    for budget in ("64", "4096"):
        save = tmp_path / budget
        args = base_args(tiny_model, save, "--num-steps", "1", "--micro-batch-tokens", budget)
        history = train(load_config(args), ListClient(fixed(batch)))
        outs.append((history[0], state_dict_of(save / "step-1")))
    (row_a, sd_a), (row_b, sd_b) = outs
    assert row_a["train/loss"] == pytest.approx(row_b["train/loss"], abs=1e-6)
    start = state_dict_of(tiny_model)
    worst = assert_same_first_adamw_step(start, sd_a, sd_b, 1e-3, gradient_error(row_a, tiny_model))
    print(f"largest difference: {worst:.3f} of its bound")
    assert max((sd_a[k] - start[k]).abs().max().item() for k in sd_a) > 5e-4


def one_step_per_mode(
    tiny_model: Path, tmp_path: Path, batch: list[dict[str, Any]], other: str
) -> tuple[dict[str, float], dict[str, float]]:
    """One step on ``batch`` with packed micro-batches and with ``other``; asserts both made the
    same first AdamW update (within the bound of their gradients' rounding) and returns the two
    steps' metrics rows."""
    rows, states = [], []
    for mode in ("packed", other):
        save = tmp_path / mode
        args = base_args(tiny_model, save, "--num-steps", "1", "--micro-batching", mode)
        cfg = load_config([*args, "--loss.kl-coef", "0.1"])  # the reference forward too
        rows.append(train(cfg, ListClient(fixed(batch)))[0])
        states.append(state_dict_of(save / "step-1"))
    start, grad_error = state_dict_of(tiny_model), gradient_error(rows[0], tiny_model)
    worst = assert_same_first_adamw_step(start, states[0], states[1], 1e-3, grad_error)
    print(f"{other} vs packed, largest difference: {worst:.3f} of its bound")
    return rows[0], rows[1]


def test_packed_and_bucketed_micro_batches_make_the_same_update(
    tiny_model: Path, tmp_path: Path
) -> None:
    packed, bucketed = one_step_per_mode(tiny_model, tmp_path, make_batch(seed=2), "bucketed")
    assert packed["train/loss"] == pytest.approx(bucketed["train/loss"], abs=1e-6)
    assert packed["train/entropy"] == pytest.approx(bucketed["train/entropy"], rel=1e-5)
    assert packed["train/padding_frac"] < bucketed["train/padding_frac"]


def test_prefix_shared_and_packed_micro_batches_make_the_same_update(
    tiny_model: Path, tmp_path: Path
) -> None:
    import numpy as np

    rng = np.random.default_rng(3)
    batch = [  # groups of replies to one prompt each, as an env samples them
        make_group(rng, [0.0, 1.0, 1.0, 0.5], 12, rng.integers(3, 14, 4).tolist(), True)
        for _ in range(2)
    ]
    packed, shared = one_step_per_mode(tiny_model, tmp_path, batch, "prefix_shared")
    assert shared["train/loss"] == pytest.approx(packed["train/loss"], abs=1e-6)
    assert shared["train/entropy"] == pytest.approx(packed["train/entropy"], rel=1e-5)
    assert shared["train/forward_tokens"] < 0.8 * packed["train/forward_tokens"]
    assert 0 <= shared["train/padding_frac"] < 0.5


def test_resume_reproduces_the_next_step_exactly(tiny_model: Path, tmp_path: Path) -> None:
    batches = lambda step: make_batch(seed=100 + step)  # noqa: E731  (the broker's data by step)
    args = base_args(tiny_model, tmp_path / "a", "--num-steps", "3", "--save-interval", "1")
    args += ["--lr-schedule", "cosine", "--warmup-steps", "1"]
    straight = ListClient(batches)
    train(load_config(args), straight)
    # a second run that stopped after step 2: resume from that checkpoint in a fresh folder
    shutil.copytree(tmp_path / "a" / "step-2", tmp_path / "b" / "step-2")
    resumed = ListClient(batches)
    resumed_args = [*args, "--save-dir", str(tmp_path / "b"), "--resume", "auto"]
    history = train(load_config(resumed_args), resumed)
    assert resumed.registrations[0].starting_step == 2 and len(history) == 1
    assert history[0]["train/step"] == 3.0
    a, b = state_dict_of(tmp_path / "a" / "step-3"), state_dict_of(tmp_path / "b" / "step-3")
    assert all(torch.equal(a[k], b[k]) for k in a)
    state_a = torch.load(tmp_path / "a" / "step-3" / "trainer_state.pt", weights_only=False)
    state_b = torch.load(tmp_path / "b" / "step-3" / "trainer_state.pt", weights_only=False)
    assert state_a["scheduler"] == state_b["scheduler"]
    assert torch.equal(state_a["rng"]["torch"], state_b["rng"]["torch"])


def test_kl_to_frozen_reference_starts_at_zero(tiny_model: Path, tmp_path: Path) -> None:
    args = base_args(tiny_model, tmp_path, "--num-steps", "2", "--loss.kl-coef", "0.5")
    history = train(load_config(args), ListClient(fixed(make_batch(seed=3))))
    assert history[0]["train/ref_kl"] == pytest.approx(0.0, abs=1e-7)
    assert history[1]["train/ref_kl"] > 0.0


def test_lora_trains_adapters_and_resumes(tiny_model: Path, tmp_path: Path) -> None:
    lora = ["--lora.enabled", "--lora.r", "4", "--loss.kl-coef", "0.1", "--lr", "1e-2"]
    args = base_args(tiny_model, tmp_path, "--num-steps", "2", "--save-interval", "1", *lora)
    history = train(load_config(args), ListClient(fixed(make_batch(seed=4))))
    assert history[0]["train/ref_kl"] == pytest.approx(0.0, abs=1e-7)  # adapters start at 0
    assert history[1]["train/ref_kl"] > 0.0  # reference = base model with adapters off
    assert (tmp_path / "step-2" / "adapter_model.safetensors").is_file()
    resumed = ListClient(fixed(make_batch(seed=4)))
    more = train(load_config([*args, "--num-steps", "3", "--resume", "auto"]), resumed)
    assert resumed.registrations[0].starting_step == 2 and len(more) == 1
    assert math.isfinite(more[0]["train/loss"])


def test_a_batch_with_nothing_to_train_leaves_the_weights(tiny_model: Path, tmp_path: Path) -> None:
    import numpy as np

    flat = [make_group(np.random.default_rng(i), [1.0] * 4) for i in range(2)]  # zero variance
    batches = {1: make_batch(seed=11), 2: flat}
    args = base_args(tiny_model, tmp_path, "--num-steps", "2", "--save-interval", "1")
    history = train(load_config(args), ListClient(lambda step: batches[step]))
    assert history[1]["train/skipped"] == 1.0 and history[1]["train/zero_variance_groups"] == 2
    a, b = state_dict_of(tmp_path / "step-1"), state_dict_of(tmp_path / "step-2")
    assert all(torch.equal(a[k], b[k]) for k in a)  # AdamW momentum did not move them


def test_gradient_checkpointing_keeps_the_update(tiny_model: Path, tmp_path: Path) -> None:
    batch = make_batch(seed=12)
    for name, flags in (("ref", []), ("ckpt", ["--gradient-checkpointing"])):
        args = base_args(tiny_model, tmp_path / name, "--num-steps", "1", *flags)
        train(load_config(args), ListClient(fixed(batch)))
    a, b = state_dict_of(tmp_path / "ref" / "step-1"), state_dict_of(tmp_path / "ckpt" / "step-1")
    row = {"train/grad_norm": 1.0, "train/computed_tokens": 0.0}  # the recompute: same sums
    assert_same_first_adamw_step(
        state_dict_of(tiny_model), a, b, 1e-3, gradient_error(row, tiny_model)
    )


def test_bf16_autocast_is_close_to_fp32(tiny_model: Path, tmp_path: Path) -> None:
    batch = make_batch(seed=12)
    rows = []
    for name, flags in (("fp32", ["--precision", "fp32"]), ("bf16", ["--precision", "bf16"])):
        args = base_args(tiny_model, tmp_path / name, "--num-steps", "1", *flags)
        rows.append(train(load_config(args), ListClient(fixed(batch)))[0])
    fp32, bf16 = rows
    # autocast did run in bf16 (near-uniform entropy of the tiny model is too flat to show it)
    assert bf16["train/grad_norm"] != fp32["train/grad_norm"]
    assert bf16["train/entropy"] == pytest.approx(fp32["train/entropy"], rel=1e-2)
    assert bf16["train/grad_norm"] == pytest.approx(fp32["train/grad_norm"], rel=5e-2)


def test_broker_outages_are_waited_out(tiny_model: Path, tmp_path: Path) -> None:
    from atroposlib.errors import BrokerUnavailableError

    class Flaky(ListClient):
        failures = 1

        def wait_for_batch(self, poll_interval: float = 0.5, timeout: float | None = None) -> Any:
            if self.failures:
                self.failures -= 1
                raise BrokerUnavailableError("broker at http://x unreachable")
            return super().wait_for_batch(poll_interval, timeout)

    args = base_args(tiny_model, tmp_path, "--num-steps", "1", "--broker-patience-s", "30")
    history = train(load_config(args), Flaky(fixed(make_batch(seed=13))))
    assert len(history) == 1
    with pytest.raises(BrokerUnavailableError):  # past the patience: the error surfaces
        train(load_config([*args, "--broker-patience-s", "0"]), Flaky(fixed(make_batch())))


def test_sequences_with_nothing_to_train_are_not_computed(tiny_model: Path, tmp_path: Path) -> None:
    """Zero-variance groups add nothing: the same update as without them, fewer tokens run."""
    import numpy as np

    live = make_batch(seed=2)
    flat = [make_group(np.random.default_rng(50 + i), [1.0] * 4) for i in range(2)]
    rows, states = [], []
    for name, batch in (("live", live), ("with_flat", [*live, *flat])):
        save = tmp_path / name
        args = base_args(tiny_model, save, "--num-steps", "1")
        rows.append(train(load_config(args), ListClient(fixed(batch)))[0])
        states.append(state_dict_of(save / "step-1"))
    assert rows[1]["train/zero_variance_groups"] == 2
    assert rows[1]["train/computed_tokens"] == rows[0]["train/computed_tokens"]
    assert rows[1]["train/loss"] == pytest.approx(rows[0]["train/loss"], abs=1e-7)
    assert rows[1]["train/entropy"] == pytest.approx(rows[0]["train/entropy"], rel=1e-6)
    start, grad_error = state_dict_of(tiny_model), gradient_error(rows[0], tiny_model)
    assert_same_first_adamw_step(start, states[0], states[1], 1e-3, grad_error)


def test_a_time_limit_stops_after_the_step_it_runs_out_in_and_saves_it(
    tiny_model: Path, tmp_path: Path
) -> None:
    args = base_args(tiny_model, tmp_path, "--num-steps", "50", "--save-interval", "100")
    client = ListClient(fixed(make_batch(seed=21)))
    history = train(load_config([*args, "--time-limit-s", "1e-6"]), client)
    assert [row["train/step"] for row in history] == [1.0]  # out of time after step 1
    assert history[0]["train/elapsed_s"] > 0
    assert client.acks == [1]  # the last step is saved (and acknowledged) like a final one
    assert (tmp_path / "step-1").is_dir()


def test_each_step_reports_where_its_time_went(tiny_model: Path, tmp_path: Path) -> None:
    """benchmarks/demo_profile.py reads these from metrics.jsonl."""
    metrics = tmp_path / "metrics.jsonl"
    args = base_args(tiny_model, tmp_path, "--num-steps", "2", "--save-interval", "2")
    client = ListClient(fixed(make_batch(seed=3)))
    history = train(load_config([*args, "--metrics-file", str(metrics)]), client)
    for row in history:
        assert row["time/forward_backward_s"] > 0 and row["time/optimizer_s"] > 0
        assert row["time/train_s"] >= row["time/forward_backward_s"] + row["time/optimizer_s"]
    assert history[1]["time/checkpoint_s"] > history[0]["time/checkpoint_s"]  # saved at step 2
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    ends = [line["time/step_end_unix_s"] for line in lines if "time/step_end_unix_s" in line]
    assert len(ends) == 2 and ends[0] < ends[1] <= time.time()
