"""Prefix sharing: a group's replies after one computed copy of their common prompt.

GRPO samples several replies to each prompt, so most sequences of a batch agree with others
up to their first trained token. ``micro_batching: prefix_shared`` lays such sequences out as
a tree: the shared prefix once (positions 0..S-1), then each member's remainder, its suffix
(positions S..L-1). A custom attention mask keeps the result exactly that of each sequence
alone: a prefix token attends causally within its prefix, a suffix token to its tree's prefix
and causally within its own suffix; nothing crosses trees, and padding attends only to itself
(a query with nothing to attend to would be NaN in SDPA).

Only the part before a sequence's first trained token is shared (prompts are never trained;
a multi-turn sequence keeps its later prompt turns in its suffix), and every suffix keeps at
least one token. The prefix's last position predicts every member's first suffix token: one
computed position, several (target, temperature) entries (``PackedRows.kept``). Logits are
computed only at trained positions, and the logprobs are gathered into the (B, T-1) layout of
MicroBatch, so the loss is the same function of the same numbers as in the other modes.

Trees are laid into rows by the packed mode's first-fit-decreasing planner
(sequence_packing.py), each tree counting its S + sum of suffix lengths tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import torch

from atroposlib.protocol import MASK_IGNORE_INDEX
from example_trainer.data import MicroBatch, PackedRows, Sample, collate


@dataclass(frozen=True)
class Tree:
    """Samples (indices) that share their first ``prefix`` tokens, and the tokens the tree
    occupies in a row: the prefix once plus each member's suffix."""

    prefix: int
    members: tuple[int, ...]
    tokens: int


def shareable(sample: Sample) -> int:
    """Leading tokens the sequence may share: those before its first trained token, leaving at
    least one token to its suffix."""
    trained = np.flatnonzero(sample.labels != MASK_IGNORE_INDEX)
    first = int(trained[0]) if trained.size else len(sample.tokens)
    return max(0, min(first, len(sample.tokens) - 1))


def common_prefix(a: np.ndarray, b: np.ndarray, limit: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(limit, len(a), len(b))
    differs = np.flatnonzero(a[:n] != b[:n])
    return int(differs[0]) if differs.size else n


def plan_trees(samples: Sequence[Sample], max_tokens: int) -> list[Tree]:
    """Split the samples into trees that share the most prompt tokens in total.

    Sorted by their shareable prompts, sequences with a common prefix are neighbours and a
    contiguous run shares the smallest common prefix of its neighbours; a dynamic program
    over the runs maximises the saved tokens, sum of (members - 1) x prefix, with each tree
    at most ``max_tokens`` long (a single sequence may be longer). Deterministic, so every
    rank plans the same trees.
    """
    share = [shareable(s) for s in samples]
    order = sorted(range(len(samples)), key=lambda i: (samples[i].tokens[: share[i]].tolist(), i))
    lengths = [len(samples[i].tokens) for i in order]
    neighbours = [  # neighbours[k]: common prefix of order[k] and order[k + 1]
        common_prefix(samples[a].tokens, samples[b].tokens, min(share[a], share[b]))
        for a, b in pairwise(order)
    ]
    saved = [0] * (len(order) + 1)  # saved[j]: the best split of order[:j]
    start = list(range(-1, len(order)))  # start[j]: where its last tree starts
    prefix_of = [0] + [share[i] for i in order]  # prefix_of[j]: that tree's shared prefix
    for j in range(1, len(order) + 1):
        saved[j], start[j] = saved[j - 1], j - 1  # order[j - 1] alone
        prefix, tokens = share[order[j - 1]], lengths[j - 1]
        for i in range(j - 2, -1, -1):  # the tree order[i:j]
            prefix = min(prefix, neighbours[i])
            tokens += lengths[i]
            if prefix == 0 or tokens - (j - i - 1) * prefix > max_tokens:
                break  # adding members only shrinks the prefix and grows the tree
            if saved[i] + (j - i - 1) * prefix > saved[j]:
                saved[j], start[j], prefix_of[j] = saved[i] + (j - i - 1) * prefix, i, prefix
    trees: list[Tree] = []
    j = len(order)
    while j > 0:
        i, prefix = start[j], prefix_of[j]
        size = sum(lengths[i:j]) - (j - i - 1) * prefix
        trees.append(Tree(prefix, tuple(order[i:j]), size))
        j = i
    return trees[::-1]


def collate_trees(rows: Sequence[Sequence[Tree]], samples: Sequence[Sample]) -> MicroBatch:
    """The padded loss tensors of ``collate`` (the trees' members in order) plus the rows:
    prefixes once, suffixes after them, the tree attention mask, logits at trained positions."""
    members = [samples[i] for row in rows for tree in row for i in tree.members]
    mb = collate(members)
    width = max(sum(tree.tokens for tree in row) for row in rows)
    n_rows = len(rows)
    ids = np.zeros((n_rows, width), np.int64)
    positions = np.zeros((n_rows, width), np.int64)
    segment = -1 - np.arange(n_rows * width).reshape(n_rows, width)  # padding: one each
    tree_of = segment.copy()
    is_prefix = np.zeros((n_rows, width), bool)
    prefix_at, suffix_at, shared = [], [], []  # per member: flat (row-major) starts, S
    n_segments = n_trees = 0
    for r, row in enumerate(rows):
        offset = 0
        for tree in row:
            s = tree.prefix
            first = samples[tree.members[0]].tokens
            ids[r, offset : offset + s] = first[:s]
            positions[r, offset : offset + s] = np.arange(s)
            segment[r, offset : offset + s] = n_segments
            tree_of[r, offset : offset + tree.tokens] = n_trees
            is_prefix[r, offset : offset + s] = True
            prefix_start, offset, n_segments = r * width + offset, offset + s, n_segments + 1
            for i in tree.members:
                tokens = samples[i].tokens
                n = len(tokens) - s
                ids[r, offset : offset + n] = tokens[s:]
                positions[r, offset : offset + n] = np.arange(s, len(tokens))
                segment[r, offset : offset + n] = n_segments
                prefix_at.append(prefix_start)
                suffix_at.append(r * width + offset)
                shared.append(s)
                offset, n_segments = offset + n, n_segments + 1
            n_trees += 1

    # (B, T-1): the flat position of token t of each member, the one that predicts t + 1
    t = np.arange(mb.targets.shape[1])[None, :]
    s_b = np.asarray(shared)[:, None]
    flat_pos = np.where(
        t < s_b, np.asarray(prefix_at)[:, None] + t, np.asarray(suffix_at)[:, None] + t - s_b
    )
    keep = mb.mask.numpy() > 0  # trained positions only (never t >= L_b - 1)
    wanted = flat_pos[keep]  # (E,) row-major (b, t) order
    scored = np.zeros(n_rows * width, bool)
    scored[wanted] = True
    rank = np.cumsum(scored) - 1  # k of each scored flat position
    index = np.full(keep.shape, len(wanted), np.int64)
    index[keep] = np.arange(len(wanted))
    temps = np.broadcast_to(mb.temperature.numpy()[:, None], keep.shape)
    mb.packed = PackedRows(
        input_ids=torch.from_numpy(ids),
        position_ids=torch.from_numpy(positions),
        scored=torch.from_numpy(scored.reshape(ids.shape)),
        targets=mb.targets[torch.from_numpy(keep)],
        temperature=torch.from_numpy(temps[keep].copy()),
        index=torch.from_numpy(index),
        kept=torch.from_numpy(rank[wanted]),
        attention_mask=torch.from_numpy(tree_attention(segment, tree_of, is_prefix)[:, None]),
    )
    return mb


def tree_attention(segment: np.ndarray, tree_of: np.ndarray, is_prefix: np.ndarray) -> np.ndarray:
    """(R, W, W) bool, query x key, True: may attend. Causal, and within one segment (a prefix,
    a suffix, a padding position) or onto the query's own tree's prefix; each input is (R, W)."""
    width = segment.shape[1]
    causal = np.tril(np.ones((width, width), bool))[None]  # (1, W, W)
    same_segment = segment[:, :, None] == segment[:, None, :]
    own_prefix = is_prefix[:, None, :] & (tree_of[:, :, None] == tree_of[:, None, :])
    return causal & (same_segment | own_prefix)
