"""Prefix sharing: a group's replies after one computed copy of their common prompt.

GRPO samples several replies to each prompt, so most sequences of a batch agree with others
up to their first trained token. ``micro_batching: prefix_shared`` lays such sequences out as
a tree: the shared prefix once (positions 0..S-1), then each member's remainder, its suffix
(positions S..L-1). A custom attention mask keeps the result exactly that of each sequence
alone: a prefix token attends causally within its prefix, a suffix token to its tree's prefix
and causally within its own suffix; nothing crosses trees, and padding attends only to itself
(a query with nothing to attend to would be NaN in SDPA).

Groups whose prompts begin alike (a few-shot env's worked examples before each new question)
nest: that beginning once, then each group's rest of its prompt once, then its members'
suffixes (the radix tree of the prompts, ``plan_trees``). A position attends causally within
its own segment and to every segment on its path from the root. Trees are laid depth first,
so a segment's descendants follow it back to back and the mask is two comparisons per
(query, key): key k is read by the queries from k to the end of k's subtree.

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

import numpy as np
import torch

from atroposlib.group import MASK_IGNORE_INDEX
from example_trainer.data import MicroBatch, PackedRows, Sample, collate


@dataclass(frozen=True)
class Tree:
    """Samples (indices) that share their first ``prefix`` tokens, and the tokens the tree
    occupies in a row: the prefix once plus each member's suffix.

    With ``branches``, the tree holds subtrees that share more (each with a longer prefix of
    its own) instead of its members' suffixes: the prefix once, then each branch's tokens
    after it; ``members`` lists the branches' members in their order."""

    prefix: int
    members: tuple[int, ...]
    tokens: int
    branches: tuple[Tree, ...] = ()


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
    """The samples as trees: every beginning that several samples share computed once (the
    radix tree of their shareable prompts, :func:`radix_tree`), then each tree longer than
    ``max_tokens`` split into copies that fit (:func:`fitted`; a single sequence may be
    longer). Deterministic, so every rank plans the same trees."""
    heads = [sample.tokens for sample in samples]
    share = [shareable(sample) for sample in samples]
    lengths = [len(sample.tokens) for sample in samples]
    order = sorted(range(len(samples)), key=lambda i: (heads[i][: share[i]].tolist(), i))
    trees = []
    for run in _runs_by_token(order, heads, share, 0):
        trees += fitted(radix_tree(run, 0, heads, share, lengths), max_tokens, lengths)
    return trees


def _runs_by_token(
    items: Sequence[int], heads: Sequence[np.ndarray], share: Sequence[int], at: int
) -> list[list[int]]:
    """Consecutive (sorted) items split where their token at ``at`` changes; an item that may
    share no more than ``at`` tokens is a run of its own."""
    runs: list[list[int]] = []
    previous = None
    for i in items:
        token = int(heads[i][at]) if share[i] > at else None
        if token is None or token != previous or not runs:
            runs.append([i])
        else:
            runs[-1].append(i)
        previous = token
    return runs


def radix_tree(
    items: Sequence[int],
    depth: int,
    heads: Sequence[np.ndarray],
    share: Sequence[int],
    lengths: Sequence[int],
) -> Tree:
    """The tree of ``items`` (sorted by their shareable heads, all agreeing on the first
    ``depth`` tokens): the beginning they all share once, then a branch for each set of them
    that shares more (a few-shot batch: the worked examples once, each group's question once,
    then its replies)."""
    if len(items) == 1:
        (i,) = items
        return Tree(share[i], (i,), lengths[i])
    limit = min(share[i] for i in items)
    prefix = depth + common_prefix(heads[items[0]][depth:], heads[items[-1]][depth:], limit - depth)
    runs = _runs_by_token(items, heads, share, prefix)
    if all(len(run) == 1 for run in runs):  # nothing more is shared: the members' suffixes
        return Tree(prefix, tuple(items), prefix + sum(lengths[i] - prefix for i in items))
    branches = [
        radix_tree(run, prefix, heads, share, lengths)
        if len(run) > 1
        else Tree(prefix, (run[0],), lengths[run[0]])
        for run in runs
    ]
    return _node(prefix, branches)


def _node(prefix: int, parts: Sequence[Tree]) -> Tree:
    """A tree of ``prefix`` tokens followed by ``parts``; plain (its members' suffixes) when
    every part is one member continuing right after the prefix."""
    members = tuple(i for part in parts for i in part.members)
    size = prefix + sum(part.tokens - prefix for part in parts)
    if all(len(part.members) == 1 and part.prefix == prefix for part in parts):
        return Tree(prefix, members, size)
    return Tree(prefix, members, size, tuple(parts))


def fitted(tree: Tree, max_tokens: int, lengths: Sequence[int]) -> list[Tree]:
    """``tree`` as copies of at most ``max_tokens`` tokens each (its prefix repeated in every
    copy; its parts, split the same way if need be, first-fit decreasing into them)."""
    if tree.tokens <= max_tokens or len(tree.members) == 1:
        return [tree]
    start = tree.prefix
    if start >= max_tokens:  # not even the prefix fits beside a token: each member alone
        return [Tree(start, (i,), lengths[i]) for i in tree.members]
    parts = tree.branches or tuple(Tree(start, (i,), lengths[i]) for i in tree.members)
    pieces = [piece for part in parts for piece in fitted(part, max_tokens, lengths)]
    pieces.sort(key=lambda piece: (-(piece.tokens - start), piece.members[0]))
    bins: list[list[Tree]] = []
    loads: list[int] = []
    for piece in pieces:
        need = piece.tokens - start
        for k, load in enumerate(loads):
            if load + need <= max_tokens - start:
                bins[k].append(piece)
                loads[k] += need
                break
        else:
            bins.append([piece])
            loads.append(need)
    return [_node(start, pieces_in) for pieces_in in bins]


@dataclass
class _Layout:
    """Where a row's segments and each member's tokens lie in the flat (row-major) rows.

    Trees are laid depth first, so a segment's descendants follow it back to back: the keys of
    a segment are visible to every query from the segment's start to its subtree's ``reach``.
    """

    width: int
    ids: np.ndarray  # (R, W)
    positions: np.ndarray  # (R, W)
    reach: np.ndarray  # (R, W): end of the subtree of each position's segment (padding: p + 1)
    paths: list[list[tuple[int, int, int]]]  # per member: (flat start, first token, end) pieces

    def place(self, row: int, offset: int, tokens: np.ndarray, first: int) -> int:
        """Lay ``tokens`` (positions ``first``...) at ``offset`` of ``row`` as a new segment."""
        end = offset + len(tokens)
        self.ids[row, offset:end] = tokens
        self.positions[row, offset:end] = np.arange(first, first + len(tokens))
        self.reach[row, offset:end] = end
        return end

    def lay(self, tree: Tree, samples: Sequence[Sample], row: int, offset: int,
            start: int, path: list[tuple[int, int, int]]) -> int:  # fmt: skip
        """Tree ``tree`` from token ``start`` on (its ancestors hold the tokens before);
        returns the offset after it."""
        head = samples[tree.members[0]].tokens
        here, head_start = row * self.width + offset, offset
        head_end = offset = self.place(row, offset, head[start : tree.prefix], start)
        path = [*path, (here, start, tree.prefix)]
        if tree.branches:
            for branch in tree.branches:
                offset = self.lay(branch, samples, row, offset, tree.prefix, path)
        else:
            for i in tree.members:
                tokens = samples[i].tokens
                here = row * self.width + offset
                offset = self.place(row, offset, tokens[tree.prefix :], tree.prefix)
                self.paths.append([*path, (here, tree.prefix, len(tokens))])
        self.reach[row, head_start:head_end] = offset  # the head is read by its whole subtree
        return offset


def collate_trees(rows: Sequence[Sequence[Tree]], samples: Sequence[Sample]) -> MicroBatch:
    """The padded loss tensors of ``collate`` (the trees' members in order) plus the rows:
    each shared segment once, suffixes after them, the tree attention mask, logits at
    trained positions."""
    members = [samples[i] for row in rows for tree in row for i in tree.members]
    mb = collate(members)
    width = max(sum(tree.tokens for tree in row) for row in rows)
    n_rows = len(rows)
    layout = _Layout(
        width,
        np.zeros((n_rows, width), np.int64),
        np.zeros((n_rows, width), np.int64),
        np.tile(np.arange(1, width + 1), (n_rows, 1)),  # padding: itself only
        [],
    )
    for r, row in enumerate(rows):
        offset = 0
        for tree in row:
            offset = layout.lay(tree, samples, r, offset, 0, [])

    # (B, T-1): the flat position of token t of each member, the one that predicts t + 1
    t_count = mb.targets.shape[1]
    flat_pos = np.zeros((len(members), t_count), np.int64)
    for b, path in enumerate(layout.paths):
        for flat_start, first, end in path:
            upto = min(end, t_count)
            if upto > first:
                flat_pos[b, first:upto] = flat_start + np.arange(upto - first)
    keep = mb.mask.numpy() > 0  # trained positions only (never t >= L_b - 1)
    wanted = flat_pos[keep]  # (E,) row-major (b, t) order
    scored = np.zeros(n_rows * width, bool)
    scored[wanted] = True
    rank = np.cumsum(scored) - 1  # k of each scored flat position
    index = np.full(keep.shape, len(wanted), np.int64)
    index[keep] = np.arange(len(wanted))
    temps = np.broadcast_to(mb.temperature.numpy()[:, None], keep.shape)
    allowed = tree_attention(layout.reach)
    mb.packed = PackedRows(
        input_ids=torch.from_numpy(layout.ids),
        position_ids=torch.from_numpy(layout.positions),
        scored=torch.from_numpy(scored.reshape(layout.ids.shape)),
        targets=mb.targets[torch.from_numpy(keep)],
        temperature=torch.from_numpy(temps[keep].copy()),
        index=torch.from_numpy(index),
        kept=torch.from_numpy(rank[wanted]),
        attention_mask=torch.from_numpy(allowed[:, None]),
    )
    return mb


def tree_attention(reach: np.ndarray) -> np.ndarray:
    """(R, W, W) bool, query x key, True: may attend. Causal, and within the key's segment or
    its descendants: key ``k`` is read by queries ``k <= q < reach[k]``, where ``reach`` (R, W)
    is where the subtree of ``k``'s segment ends in its row (a padding position's: ``k + 1``).
    Two comparisons over the (R, W, W) mask, as cheap as the causal mask itself."""
    position = np.arange(reach.shape[1])
    causal = position[None, :, None] >= position[None, None, :]  # (1, W, W)
    return causal & (position[None, :, None] < reach[:, None, :])
