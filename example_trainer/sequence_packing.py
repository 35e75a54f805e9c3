"""Sequence packing: whole sequences back to back in rows, the loss on the padded layout.

Sequences are packed into rows of at most ``row_tokens`` tokens (first-fit decreasing; a
longer sequence gets a row of its own), and rows into micro-batches of rows x longest row
<= ``micro_batch_tokens``. ``position_ids`` restart at 0 for each sequence and no attention
mask is passed, so transformers builds a block-diagonal causal mask
(``masking_utils.find_packed_sequence_indices``): no token attends to another sequence and
almost no compute goes to padding. The row length bounds the attention cost, which grows
with its square (SDPA/eager compute the whole masked square), hence rows about as long as
the longest sequence (``row_length``) rather than one row of the whole budget.

The per-token logprobs are gathered into the (B, T-1) next-token layout of MicroBatch,
gradient flowing through the gather, so the loss (per-row temperature, inference/ref
logprobs, GSPO ratio, sequence-mean aggregation, SFT rows) is the same function of the same
numbers in every micro-batching mode. The last position of each sequence predicts the first
token of the next one; it is never gathered, so never trained (in the padded layout it is
no target either). With ``trained_only`` the vocabulary projection and log-softmax run only
at trained positions (scored_positions_only): every loss term and metric is masked to trained
tokens, so the loss does not change.

``micro_batching: prefix_shared`` lays out trees of sequences sharing a prompt instead
(prefix_sharing.py) and plans them here with the same row planner.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from example_trainer.checkpoint import unwrap
from example_trainer.config import TrainerConfig
from example_trainer.data import (
    MicroBatch,
    PackedRows,
    Sample,
    collate,
    micro_batch_costs,
    plan_microbatches,
)
from example_trainer.loss import token_logprobs
from example_trainer.prefix_sharing import Tree, collate_trees, plan_trees

logger = logging.getLogger(__name__)


def plan_packed(
    lengths: Sequence[int], row_tokens: int, micro_batch_tokens: int | None = None
) -> list[list[list[int]]]:
    """Micro-batches of rows of sequence indices (first-fit decreasing into the rows).

    Rows hold <= row_tokens tokens unless a single sequence is longer; a micro-batch holds
    rows while rows x longest row <= micro_batch_tokens (default: one row each). The plan is
    deterministic, so every rank computes the same one.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for r, load in enumerate(loads):
            if load + lengths[i] <= row_tokens:
                rows[r].append(i)
                loads[r] += lengths[i]
                break
        else:
            rows.append([i])
            loads.append(lengths[i])
    budget = micro_batch_tokens or 0
    plan: list[list[list[int]]] = []
    widest = 0
    for row, load in sorted(zip(rows, loads, strict=True), key=lambda x: -x[1]):
        if plan and (len(plan[-1]) + 1) * max(widest, load) <= budget:
            plan[-1].append(row)
        else:
            plan.append([row])
            widest = 0
        widest = max(widest, load)
    return plan


def row_length(lengths: Sequence[int], cap: int) -> int:
    """Default row length: the power of two >= the longest sequence, at most ``cap``.

    Every sequence fits a row, so first-fit decreasing leaves little padding at row ends,
    and a row's attention square stays within 4x the longest sequence's own, which a padded
    layout pays anyway (measured on CPU: rows of 512 tokens for sequences up to 391 make the
    step 13% faster than one 1024-token row).
    """
    return min(cap, 1 << max(0, max(lengths, default=1) - 1).bit_length())


def packed_costs(plan: Sequence[Sequence[Sequence[int]]], lengths: Sequence[int]) -> list[int]:
    """Tokens each packed micro-batch processes: rows x longest row."""
    return [len(mb) * max(sum(lengths[i] for i in row) for row in mb) for mb in plan]


def collate_packed(rows: Sequence[Sequence[Sample]], trained_only: bool = True) -> MicroBatch:
    """The padded loss tensors of ``collate`` (rows' sequences in order) plus the packed rows."""
    samples = [s for row in rows for s in row]
    mb = collate(samples)
    t = mb.targets.shape[1]  # T-1
    width = max(sum(len(s.tokens) for s in row) for row in rows)
    ids = np.zeros((len(rows), width), np.int64)
    positions = np.zeros((len(rows), width), np.int64)
    temps = np.ones((len(rows), width), np.float32)
    starts = []  # flat (row-major) position of each sequence's first token
    for r, row in enumerate(rows):
        offset = 0
        for s in row:
            n = len(s.tokens)
            ids[r, offset : offset + n] = s.tokens
            positions[r, offset : offset + n] = np.arange(n)
            temps[r, offset : offset + n] = s.temperature
            starts.append(r * width + offset)
            offset += n
        positions[r, offset:] = np.arange(width - offset)  # padding: a segment of its own
    flat_ids = ids.reshape(-1)
    next_ids = np.append(flat_ids[1:], 0)  # the token after each position
    flat_pos = np.asarray(starts)[:, None] + np.arange(t)[None, :]  # (B, T-1) -> flat position
    lengths = np.asarray([len(s.tokens) for s in samples])
    if trained_only:
        keep = mb.mask.numpy() > 0  # trained positions only (never t >= L_b - 1)
        scored = np.zeros(flat_ids.shape, bool)
        scored[flat_pos[keep]] = True
        rank = np.cumsum(scored) - 1  # k of each scored flat position (row-major order)
        index = np.where(keep, rank[np.where(keep, flat_pos, 0)], int(scored.sum()))
        next_ids, flat_temps = next_ids[scored], temps.reshape(-1)[scored]
    else:
        scored = None
        valid = np.arange(t)[None, :] < (lengths - 1)[:, None]  # drops each sequence's last
        index = np.where(valid, flat_pos, flat_ids.size)
        flat_temps = temps.reshape(-1)
    mb.packed = PackedRows(
        input_ids=torch.from_numpy(ids),
        position_ids=torch.from_numpy(positions),
        scored=None if scored is None else torch.from_numpy(scored.reshape(ids.shape)),
        targets=torch.from_numpy(next_ids),
        temperature=torch.from_numpy(flat_temps),
        index=torch.from_numpy(index),
    )
    return mb


def student_distill_logprobs(model: Any, mb: MicroBatch) -> Tensor:
    """(B, T-1, K) student logprobs (at each row's temperature) of the teacher's ids; padded
    layout only (the config refuses packed micro-batches with distillation)."""
    assert mb.distill_ids is not None and mb.packed is None
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
    logits = out.logits[:, :-1].float() / mb.temperature[:, None, None]  # (B, T-1, V)
    return torch.log_softmax(logits, dim=-1).gather(-1, mb.distill_ids.clamp(min=0))


@contextmanager
def scored_positions_only(model: Any, scored: Tensor | None) -> Iterator[None]:
    """The output projection sees only the hidden states at ``scored`` positions (a forward
    pre-hook on it: transformers before 5.2x take no 2-D ``logits_to_keep``, and calling the
    decoder and the head apart would skip DDP's and FSDP's hooks on the whole model)."""
    if scored is None:
        yield
        return

    def keep(module: Any, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        return (args[0][scored][None], *args[1:])  # (R, W, H) -> (1, K, H)

    handle = unwrap(model).get_output_embeddings().register_forward_pre_hook(keep)
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def fp32_output_projection(model: Any) -> Iterator[None]:
    """The output projection computed in fp32 under bf16 autocast (its fp32 weights, the
    hidden states upcast); everything else stays in bf16."""
    head = unwrap(model).get_output_embeddings()

    def forward(hidden: Tensor) -> Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            bias = None if head.bias is None else head.bias.float()
            return torch.nn.functional.linear(hidden.float(), head.weight.float(), bias)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward  # the class's forward again


def model_logprobs(model: Any, mb: MicroBatch, entropy_grad: bool = False) -> tuple[Tensor, Tensor]:
    """Logprobs and entropy of ``mb.targets`` (B, T-1), from the packed rows if there are any.

    Filler positions (padding, and untrained ones with ``trained_only``) hold 0.0; the loss
    masks them.
    """
    p = mb.packed
    if p is None:
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
        return token_logprobs(out.logits[:, :-1], mb.targets, mb.temperature, entropy_grad)
    with scored_positions_only(model, p.scored):  # bool (R, W): (K, V) logits
        out = model(
            input_ids=p.input_ids,
            position_ids=p.position_ids,
            attention_mask=attention_mask(model, p.attention_mask),
            use_cache=False,
        )
    logits = out.logits.reshape(-1, out.logits.shape[-1])  # (K, V)
    if p.kept is not None:
        logits = logits[p.kept]  # (E, V): a prefix's last position serves every member
    logp, entropy = token_logprobs(  # (E, 1): each entry at its own temperature
        logits[:, None], p.targets[:, None], p.temperature, entropy_grad
    )
    filler = logp.new_zeros(1, 1)
    return torch.cat([logp, filler])[p.index, 0], torch.cat([entropy, filler])[p.index, 0]


def attention_mask(model: Any, allowed: Tensor | None) -> Tensor | None:
    """The (R, 1, W, W) mask as the model's attention takes it: SDPA a boolean one (True: may
    attend), eager an additive one (transformers passes a 4-D mask through as it is)."""
    if allowed is None:
        return None  # block-diagonal causal mask from the restarting position_ids
    implementation = getattr(unwrap(model).config, "_attn_implementation", "sdpa")
    if implementation == "sdpa":
        return allowed
    if implementation == "eager":
        blocked = torch.finfo(torch.float32).min
        return torch.zeros(allowed.shape, device=allowed.device).masked_fill(~allowed, blocked)
    raise ValueError(
        f"micro_batching prefix_shared needs a custom attention mask, which attention "
        f"implementation {implementation} does not take; load the model with sdpa or eager"
    )


# Dispatch on the trainer's micro_batching setting


@dataclass
class MicroBatchPlan:
    """A step's micro-batches: sample indices (bucketed), rows of them (packed), rows of
    trees (prefix_shared)."""

    entries: list[Any]
    costs: list[int]  # positions each micro-batch computes: rows x longest row
    tokens: int  # tokens laid into the rows (a shared prefix once)


def micro_batch_plan(cfg: TrainerConfig, samples: Sequence[Sample]) -> MicroBatchPlan:
    """The micro-batches of a step's samples and the positions each computes."""
    lengths = [len(s.tokens) for s in samples]
    cap = min(cfg.pack_row_tokens or cfg.max_token_len, cfg.micro_batch_tokens)
    if cfg.micro_batching == "prefix_shared":
        return tree_plan(samples, cfg.micro_batch_tokens, cfg.pack_row_tokens)
    if cfg.micro_batching == "packed":
        row_tokens = cap if cfg.pack_row_tokens else row_length(lengths, cap)
        packed = plan_packed(lengths, row_tokens, cfg.micro_batch_tokens)
        return MicroBatchPlan(list(packed), packed_costs(packed, lengths), sum(lengths))
    plan = plan_microbatches(lengths, cfg.micro_batch_tokens)
    return MicroBatchPlan(list(plan), micro_batch_costs(plan, lengths), sum(lengths))


def tree_plan(
    samples: Sequence[Sample], budget: int, row_tokens: int | None = None
) -> MicroBatchPlan:
    """prefix_shared: the samples as trees (prefix_sharing.plan_trees), laid into rows of
    ``row_tokens`` (default: the power of two the trees need) by the packed planner, rows of
    at most ``budget`` positions per micro-batch. A tree holds several sequences, each up to
    max_token_len, so a tree is bounded by the row, not by max_token_len."""
    cap = min(row_tokens or budget, budget)
    trees = plan_trees(samples, cap)
    sizes = [tree.tokens for tree in trees]
    rows = plan_packed(sizes, cap if row_tokens else row_length(sizes, cap), budget)
    entries = [[[trees[k] for k in row] for row in mb] for mb in rows]
    return MicroBatchPlan(list(entries), packed_costs(rows, sizes), sum(sizes))


def micro_batch(cfg: TrainerConfig, samples: list[Sample], planned: Any) -> MicroBatch:
    """Tensors of one planned micro-batch; None: a dummy of sample 0 (masked by the caller)."""
    if cfg.micro_batching == "prefix_shared":
        alone = [[Tree(0, (0,), len(samples[0].tokens))]]
        return collate_trees(planned if planned is not None else alone, samples)
    if cfg.micro_batching == "packed":
        rows = planned if planned is not None else [[0]]
        return collate_packed([[samples[i] for i in row] for row in rows], cfg.trained_logits_only)
    return collate([samples[i] for i in (planned if planned is not None else [0])])
