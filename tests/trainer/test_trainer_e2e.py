"""The trainer against real processes: the broker (crash + resume) and the embedded server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from trainer_helpers import base_args, make_batch, state_dict_of

from atroposlib.client import Batch, TrainerClient
from example_trainer.config import load_config
from example_trainer.train import train


def post_batches(url: str, n_batches: int) -> None:
    """Queue n batches (2 groups of 4) in order, as an env would."""
    for b in range(n_batches):
        for group in make_batch(seed=300 + b):
            body = {
                k: [np.asarray(x).tolist() for x in v]
                if k in ("tokens", "masks", "inference_logprobs")
                else v
                for k, v in group.items()
                if v is not None and k != "env_id"  # no env registered: anonymous data
            }
            httpx.post(url + "/scored_data", json=body, timeout=30).raise_for_status()


class Recording:
    """TrainerClient that records batches and can crash on the n-th fetch."""

    def __init__(self, url: str, crash_on_fetch: int | None = None) -> None:
        self.client, self.crash_on_fetch = TrainerClient(url, encoding="msgpack"), crash_on_fetch
        self.batches: list[Batch] = []
        self.acks: list[int] = []

    def register(self, registration: Any) -> int:
        return self.client.register(registration)

    def wait_for_batch(self, poll_interval: float = 0.5, timeout: float | None = None) -> Batch:
        if len(self.batches) + 1 == self.crash_on_fetch:
            raise RuntimeError("simulated crash")
        batch = self.client.wait_for_batch(0.05, timeout=60)
        self.batches.append(batch)
        return batch

    def ack(self, step: int) -> None:
        self.acks.append(step)
        self.client.ack(step)

    def close(self) -> None:
        self.client.close()


def tokens_of(batch: Batch) -> list[list[int]]:
    return [np.asarray(t).tolist() for g in batch.groups for t in g["tokens"]]


@pytest.mark.slow
def test_crash_and_resume_against_the_broker_matches_a_straight_run(
    service: Callable[..., str], tiny_model: Path, tmp_path: Path
) -> None:
    args = base_args(tiny_model, tmp_path / "crashed", "--num-steps", "4", "--save-interval", "2")
    broker = service("atroposlib.api", "--store", "memory")
    post_batches(broker, 4)
    crashed = Recording(broker, crash_on_fetch=4)
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(load_config(args), crashed)
    assert crashed.acks == [2] and [b.step for b in crashed.batches] == [1, 2, 3]

    resumed = Recording(broker)
    train(load_config([*args, "--resume", "auto"]), resumed)
    assert [b.step for b in resumed.batches] == [3, 4] and resumed.acks == [4]
    assert tokens_of(resumed.batches[0]) == tokens_of(crashed.batches[2])  # redelivered

    control_broker = service("atroposlib.api", "--store", "memory")
    post_batches(control_broker, 4)
    control_args = base_args(tiny_model, tmp_path / "straight", "--num-steps", "4")
    train(load_config([*control_args, "--save-interval", "2"]), Recording(control_broker))
    a = state_dict_of(tmp_path / "crashed" / "step-4")
    b = state_dict_of(tmp_path / "straight" / "step-4")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.model
def test_disk_sync_changes_the_embedded_servers_outputs(
    service: Callable[..., str], test_model_path: Path, tmp_path: Path
) -> None:
    server = service(
        "atroposlib.inference", "--model", str(test_model_path), "--weight-roots", str(tmp_path)
    )
    request = {"model": str(test_model_path), "prompt": "What is 2+3?", "max_tokens": 6}
    request |= {"temperature": 0.0, "logprobs": 0}

    def greedy() -> list[float]:
        answer = httpx.post(server + "/v1/completions", json=request, timeout=120)
        assert answer.is_success, answer.text
        answer = answer.json()
        return list(answer["choices"][0]["logprobs"]["token_logprobs"])

    before = greedy()
    sync = ["--weight-sync", "disk", "--inference-urls", f'["{server}"]']
    args = base_args(test_model_path, tmp_path, "--num-steps", "1", "--lr", "1e-4", *sync)
    args += ["--batch-size", "4", "--micro-batch-tokens", "128"]
    batch = make_batch(seed=9, n_groups=1)
    history = train(load_config(args), _fixed_client(batch))
    assert history[0]["train/grad_norm"] > 0
    assert httpx.get(server + "/health").json()["weight_version"] == 1
    after = greedy()
    assert max(abs(x - y) for x, y in zip(before, after, strict=False)) > 1e-4


def _fixed_client(groups: list[dict[str, Any]]) -> Any:
    from trainer_helpers import ListClient, fixed

    return ListClient(fixed(groups))
