"""Helpers for the trainer tests: a tiny random Llama, plain-dict batches, a fake client."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from atroposlib.wire.broker import TrainerRegistration
from example_trainer.config import LossConfig

VOCAB = 256
FAKE_SERVER = Path(__file__).parent / "fake_inference_server.py"
MIXED_LOSSES = {
    "gspo_seq_mean_kl_entropy": LossConfig(
        ratio="sequence",
        aggregation="seq_mean_token_mean",
        behavior_logprobs="inference",
        kl_coef=0.1,
        entropy_coef=0.01,
        clip_eps_low=0.5,
        clip_eps_high=0.5,
    ),
    "token_tis_constant": LossConfig(is_correction="tis", aggregation="constant"),
}
"""Losses that exercise every path of grpo_loss (sequence ratio, KL, entropy, clipping; TIS
with the constant aggregation): micro-batching modes must agree under each."""


def tiny_llama(path: Path, seed: int = 0) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


def make_group(
    rng: np.random.Generator,
    scores: Sequence[float],
    prompt_len: int = 6,
    completion_lens: Sequence[int] | None = None,
    shared_prompt: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """One group shaped like a broker batch entry (numpy arrays, all keys present); with
    ``shared_prompt`` every reply follows the same prompt, as an env's n samples do."""
    lens = completion_lens or [8] * len(scores)
    prompt = rng.integers(1, VOCAB, size=prompt_len) if shared_prompt else None
    tokens, masks, inf = [], [], []
    for n in lens:
        t = rng.integers(1, VOCAB, size=prompt_len + n).astype(np.int32)
        if prompt is not None:
            t[:prompt_len] = prompt
        m = t.copy()
        m[:prompt_len] = -100
        tokens.append(t)
        masks.append(m)
        lp = np.full(len(t), 1.0, np.float32)
        lp[prompt_len:] = -rng.uniform(3.0, 8.0, size=n)
        inf.append(lp)
    group: dict[str, Any] = {
        "tokens": tokens,
        "masks": masks,
        "scores": list(scores),
        "advantages": None,
        "ref_logprobs": None,
        "messages": None,
        "generation_params": None,
        "inference_logprobs": inf,
        "overrides": None,
        "group_overrides": None,
        "images": None,
        "env_id": 0,
        "policy_version": None,
    }
    group.update(extra)
    return group


def make_batch(seed: int = 0, n_groups: int = 2, group_size: int = 4) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        make_group(
            rng,
            rng.integers(0, 2, size=group_size).astype(float).tolist()
            if g
            else [0.0, 1.0, 1.0, 0.5][:group_size],
            completion_lens=rng.integers(3, 20, size=group_size).tolist(),
        )
        for g in range(n_groups)
    ]


@dataclass
class FakeBatch:
    step: int | None
    groups: list[dict[str, Any]]


class ListClient:
    """In-memory stand-in for TrainerClient: serves batches by step, records acks."""

    def __init__(self, batches: Callable[[int], list[dict[str, Any]]]) -> None:
        self.batches = batches
        self.registrations: list[TrainerRegistration] = []
        self.acks: list[int] = []
        self.next_step = 1

    def register(self, registration: TrainerRegistration) -> int:
        self.registrations.append(registration)
        self.next_step = registration.starting_step + 1
        return len(self.registrations)

    def wait_for_batch(self, poll_interval: float = 0.5, timeout: float | None = None) -> FakeBatch:
        step = self.next_step
        self.next_step += 1
        return FakeBatch(step, self.batches(step))

    def ack(self, step: int) -> None:
        self.acks.append(step)

    def close(self) -> None:
        """Nothing to close."""


def fixed(groups: Iterable[dict[str, Any]]) -> Callable[[int], list[dict[str, Any]]]:
    frozen = list(groups)
    return lambda step: frozen


def with_model_logprobs(model_path: Path, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set each group's inference_logprobs to the model's own (an exactly on-policy batch)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
    for group in groups:
        rows = []
        for tokens in group["tokens"]:
            ids = torch.as_tensor(np.asarray(tokens, np.int64))[None]
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            lp = np.ones(len(tokens), np.float32)
            lp[1:] = logp.gather(-1, ids[0, 1:, None])[:, 0].numpy()
            rows.append(lp)
        group["inference_logprobs"] = rows
    return groups


def state_dict_of(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def base_args(model: Path, save_dir: Path, *extra: str) -> list[str]:
    return [
        "--model", str(model), "--save-dir", str(save_dir), "--lr", "1e-3",
        "--batch-size", "8", "--max-token-len", "64", "--micro-batch-tokens", "96",
        *extra,
    ]  # fmt: skip
