"""Sequence packing: whole sequences back to back in one row, the loss on the padded layout.

A packed micro-batch is one row of at most ``micro_batch_tokens`` tokens (first-fit
decreasing; a longer sequence gets a row of its own). ``position_ids`` restart at 0 for each
sequence and no attention mask is passed, so transformers builds a block-diagonal causal mask
(``masking_utils.find_packed_sequence_indices``): no token attends to another sequence and no
compute goes to padding. The per-token logprobs of the row are then gathered into the
(B, T-1) next-token layout of MicroBatch, gradient flowing through the gather, so the loss
(per-row temperature, inference/ref logprobs, GSPO ratio, sequence-mean aggregation, SFT
rows) is the same function of the same numbers in every micro-batching mode.

The last position of each sequence predicts the first token of the next one; it is never
gathered, so it is never trained (in the padded layout it is no target either). With
``trained_only`` the vocabulary projection and log-softmax run only at trained positions
(``logits_to_keep``): prompt positions are never trained, and every loss term and metric is
masked to trained tokens, so the loss does not change.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from example_trainer.data import MicroBatch, PackedRow, Sample, collate
from example_trainer.loss import token_logprobs

logger = logging.getLogger(__name__)


def plan_packed(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Sequence indices per packed row, sum of lengths <= token_budget (first-fit decreasing).

    A sequence longer than the budget gets a row of its own; the plan is deterministic, so
    every rank computes the same one.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for r, load in enumerate(loads):
            if load + lengths[i] <= token_budget:
                rows[r].append(i)
                loads[r] += lengths[i]
                break
        else:
            rows.append([i])
            loads.append(lengths[i])
    return rows


def collate_packed(samples: Sequence[Sample], trained_only: bool = True) -> MicroBatch:
    """The padded loss tensors of ``collate`` plus the packed row the forward runs on."""
    mb = collate(samples)
    b, t = mb.targets.shape  # (B, T-1)
    lengths = np.asarray([len(s.tokens) for s in samples])
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    ids = np.concatenate([s.tokens for s in samples]).astype(np.int64)  # (N,)
    positions = np.concatenate([np.arange(n) for n in lengths])  # (N,)
    next_ids = np.append(ids[1:], 0)  # the token after each row position
    temps = np.repeat(np.asarray([s.temperature for s in samples], np.float32), lengths)
    row_pos = starts[:, None] + np.arange(t)[None, :]  # (B, T-1): row position of targets[b, t]
    if trained_only:
        keep = mb.mask.numpy() > 0  # trained positions only (never t >= L_b - 1)
        scored: np.ndarray | None = row_pos[keep]
        index = np.full((b, t), len(scored), np.int64)
        index[keep] = np.arange(len(scored))
        next_ids, temps = next_ids[scored], temps[scored]
    else:
        scored = None
        valid = np.arange(t)[None, :] < (lengths - 1)[:, None]  # drops each sequence's last
        index = np.where(valid, row_pos, len(ids))
    mb.packed = PackedRow(
        input_ids=torch.from_numpy(ids)[None],
        position_ids=torch.from_numpy(positions)[None],
        scored=None if scored is None else torch.from_numpy(scored),
        targets=torch.from_numpy(next_ids),
        temperature=torch.from_numpy(temps),
        index=torch.from_numpy(index),
    )
    return mb


def model_logprobs(model: Any, mb: MicroBatch, entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
    """Logprobs and entropy of ``mb.targets`` (B, T-1), from the packed row when there is one.

    Filler positions (padding, and untrained ones with ``trained_only``) hold 0.0; the loss
    masks them.
    """
    p = mb.packed
    if p is None:
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
        return token_logprobs(out.logits[:, :-1], mb.targets, mb.temperature, entropy_grad)
    out = model(
        input_ids=p.input_ids,
        position_ids=p.position_ids,
        attention_mask=None,  # block-diagonal causal mask from the restarting position_ids
        use_cache=False,
        logits_to_keep=0 if p.scored is None else p.scored,
    )
    logits = out.logits[0, :, None]  # (K, 1, V): one "row" per position, its own temperature
    logp, entropy = token_logprobs(logits, p.targets[:, None], p.temperature, entropy_grad)
    filler = logp.new_zeros(1, 1)
    return torch.cat([logp, filler])[p.index, 0], torch.cat([entropy, filler])[p.index, 0]
