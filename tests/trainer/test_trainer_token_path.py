"""The token path through the real loop: embedded server -> env ``serve`` -> broker -> trainer.

Replies cut at ``max_completion_tokens`` come back with ``finish_reason: length``; the env marks
those sequences truncated, and ``loss.mask_truncated`` keeps exactly them out of the loss. The
same batch trains with TIS and with mask corrections on the real inference logprobs: at step 0
(same weights) the importance ratio is 1 and nothing is masked.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from trainer_helpers import ListClient, base_args, fixed

from atroposlib.client import Batch, TrainerClient
from example_trainer.config import load_config
from example_trainer.train import train

pytestmark = [pytest.mark.slow, pytest.mark.model]
REPO = Path(__file__).resolve().parents[2]


class Recording:
    """The broker's TrainerClient, keeping the batch it hands out."""

    def __init__(self, url: str) -> None:
        self.client = TrainerClient(url, encoding="msgpack")
        self.batches: list[Batch] = []

    def register(self, registration: Any) -> int:
        return self.client.register(registration)

    def wait_for_batch(self, poll_interval: float = 0.5, timeout: float | None = None) -> Batch:
        self.batches.append(self.client.wait_for_batch(0.1, timeout=600))
        return self.batches[-1]

    def ack(self, step: int) -> None:
        self.client.ack(step)

    def close(self) -> None:
        self.client.close()


def test_truncated_replies_are_masked_and_the_ratio_is_one_at_step_zero(
    service: Callable[..., str],
    test_model_path: Path,
    tmp_path: Path,
    subprocess_env: dict[str, str],
) -> None:
    inference = service("atroposlib.inference", "--model", str(test_model_path), "--threads", "1")
    broker = service("atroposlib.api", "--store", "memory")
    env = subprocess.Popen(
        [sys.executable, str(REPO / "environments/reasoning_gym/env.py"), "serve",
         "--config", str(REPO / "configs/local-cpu-env.yaml"),
         "--openai.base_url", f"{inference}/v1", "--env.tokenizer_name", str(test_model_path),
         "--env.rollout_server_url", broker, "--env.group_size", "4",
         "--env.max_completion_tokens", "7", "--env.total_steps", "1",
         "--env.max_token_length", "256",
         # its truncated groups score all 0: the demo's config would drop them at the env
         "--env.ensure_scores_are_not_same", "false"],
        env=subprocess_env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        common = ["--num-steps", "1", "--lr", "1e-6", "--max-token-len", "256",
                  "--micro-batch-tokens", "512",
                  "--loss.behavior-logprobs", "inference"]  # fmt: skip
        args = base_args(test_model_path, tmp_path / "masked", *common)
        recording = Recording(broker)
        [masked] = train(load_config([*args, "--loss.mask-truncated"]), recording)
    finally:
        env.kill()
        env.wait(timeout=30)
    groups = recording.batches[0].groups
    reasons = [reason for group in groups for reason in group["finish_reasons"]]
    assert all(group["inference_logprobs"] is not None for group in groups)
    assert reasons.count("length") >= 1, "7 tokens are too few for most of its replies"
    assert masked["train/truncated_masked"] == reasons.count("length")

    results = {}
    for correction in ("tis", "mask"):
        args = base_args(test_model_path, tmp_path / correction, *common)
        args += ["--loss.is-correction", correction, "--no-loss.mask-zero-variance-groups"]
        [results[correction]] = train(load_config(args), ListClient(fixed(groups)))
    assert results["tis"]["train/truncated_masked"] == 0
    assert abs(results["tis"]["train/is_weight"] - 1.0) <= 1e-4
    assert results["tis"]["train/mismatch_kl"] < 1e-8
    assert results["mask"]["train/is_masked_frac"] == 0.0
    assert results["tis"]["train/trained_tokens"] > masked["train/trained_tokens"]
