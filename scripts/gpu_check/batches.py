"""Broker-shaped GRPO batches of random tokens: groups of replies sharing their prompt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class BatchShape:
    groups: int
    group_size: int
    prompt: tuple[int, int]  # tokens, drawn uniformly
    reply_median: int  # lognormal reply lengths (sigma 0.6), clipped to reply_range
    reply_range: tuple[int, int]


TIMED = {
    "cuda": BatchShape(32, 8, (150, 250), 300, (32, 1500)),
    "cpu": BatchShape(4, 4, (20, 40), 24, (8, 60)),
}
"""The batch a timed step trains on: an RL math env's shape on a GPU (256 sequences, ~150k
tokens), a small one on CPU."""
COMPARED = {
    "cuda": BatchShape(4, 4, (150, 250), 120, (32, 400)),
    "cpu": BatchShape(2, 4, (20, 40), 16, (8, 40)),
}
"""The batch of the bf16-vs-fp32 comparison."""


def make_groups(
    shape: BatchShape, vocab: int, seed: int, unit_advantages: bool = False
) -> list[dict[str, Any]]:
    """Groups as the broker hands them to the trainer. Scores alternate 0/1 within a group;
    ``unit_advantages``: every reply token gets advantage 1 (the env-given field), so the loss
    is about -mean(ratio) and its bf16/fp32 difference measures the logprobs' difference."""
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(shape.groups):
        prompt = rng.integers(100, vocab, size=int(rng.integers(*shape.prompt)))
        lengths = np.clip(
            rng.lognormal(np.log(shape.reply_median), 0.6, size=shape.group_size),
            *shape.reply_range,
        ).astype(int)
        tokens, masks, advantages = [], [], []
        for n in lengths:
            seq = np.concatenate([prompt, rng.integers(100, vocab, size=n)]).astype(np.int32)
            mask = seq.copy()
            mask[: len(prompt)] = -100
            tokens.append(seq)
            masks.append(mask)
            advantages.append(np.where(mask == -100, 0.0, 1.0).astype(np.float32))
        groups.append(
            {
                "tokens": tokens,
                "masks": masks,
                "scores": [float(i % 2) for i in range(shape.group_size)],
                "advantages": advantages if unit_advantages else None,
                "ref_logprobs": None,
                "messages": None,
                "generation_params": None,
                "inference_logprobs": None,
                "overrides": None,
                "group_overrides": None,
                "images": None,
                "env_id": 0,
                "policy_version": None,
            }
        )
    return groups


def sequence_tokens(groups: list[dict[str, Any]]) -> int:
    return sum(len(t) for g in groups for t in g["tokens"])
