"""Prompts that differ only in their tails: the common beginning computed once.

An evaluation sends hundreds of prompts that share a long beginning (the chat template's
system turn, the worked examples) and differ in a short question. The fast path's
:class:`SharedPrefix` then holds that beginning once: it is run alone, each prompt's tail
is run after it (the prefix's keys and values in the cache, so the tail attends to them as
it would in one forward), and each row keeps only its tail as private keys and values. On a
CPU this cuts the prefill of a few-shot evaluation several times; the decode step reads the
shared beginning once per step for all its rows.

A prompt joining later reuses a computed prefix of the same weights when it starts with it,
or the beginning it shares with one (a view of that prefix's keys, nothing recomputed): a GRPO
env's groups repeat the same worked examples before a new question, so each group after the
first runs only its question.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from atroposlib.inference.fast_decode import context_kv
from atroposlib.inference.kv_cache import SharedPrefix

MIN_SHARED_TOKENS = 32
"""A shorter common beginning is not worth a separate forward."""
SNAP_TOKENS = 16
"""A prompt continues a whole computed prefix rather than cut a new beginning from one unless
the cut would be longer by more than this (fewer distinct prefixes for the decode step)."""
TAIL_ROWS_PER_FORWARD = 16
"""Tails run together after one prefix (each holds a copy of its keys while it runs)."""

Context = tuple[int, ...]


def common_prefix_length(contexts: Sequence[Sequence[int]]) -> int:
    """Tokens every context starts with, leaving each at least one token of its own.

    >>> common_prefix_length([(1, 2, 3, 4), (1, 2, 5), (1, 2, 3)])
    2
    >>> common_prefix_length([(1, 2), (1, 2)])
    1
    """
    if not contexts:
        return 0
    shortest = min(len(context) for context in contexts)
    first = contexts[0]
    length = 0
    while length < shortest - 1 and all(c[length] == first[length] for c in contexts):
        length += 1
    return length


def live_prefix_of(
    context: Context, running: Iterable[SharedPrefix], generation: int
) -> SharedPrefix | None:
    """The longest running prefix of the current weights that ``context`` continues."""
    best: SharedPrefix | None = None
    for prefix in running:
        length = len(prefix.tokens)
        if prefix.generation != generation or length >= len(context):
            continue
        if context[:length] == prefix.tokens and (best is None or length > len(best.tokens)):
            best = prefix
    return best


def shared_length(context: Context, tokens: Context) -> int:
    """Tokens ``context`` and ``tokens`` start with, leaving ``context`` one of its own.

    >>> shared_length((1, 2, 3, 4), (1, 2, 5))
    2
    >>> shared_length((1, 2), (1, 2, 3))
    1
    """
    limit = min(len(context) - 1, len(tokens))
    length = 0
    while length < limit and context[length] == tokens[length]:
        length += 1
    return length


def beginning_to_continue(
    context: Context, known: Sequence[SharedPrefix], generation: int
) -> SharedPrefix | None:
    """The computed beginning ``context`` should run its tail after, or None when it shares
    fewer than ``MIN_SHARED_TOKENS`` with every prefix of the current weights in ``known``.

    The longest known prefix that ``context`` continues whole, unless one of them shares a
    beginning longer by more than ``SNAP_TOKENS`` with it: then that beginning, cut from it.
    """
    current = [prefix for prefix in known if prefix.generation == generation]
    whole = live_prefix_of(context, current, generation)
    longest, source = 0, None
    for prefix in current:
        length = shared_length(context, prefix.tokens)
        if length > longest:
            longest, source = length, prefix
    if whole is not None and len(whole.tokens) >= max(MIN_SHARED_TOKENS, longest - SNAP_TOKENS):
        return whole
    if source is None or longest < MIN_SHARED_TOKENS:
        return None
    return source if longest == len(source.tokens) else source.cut(longest)


@torch.inference_mode()
def run_tails(
    model: PreTrainedModel, prefix: SharedPrefix, contexts: Sequence[Context], pad_id: int
) -> tuple[list[Tensor], Tensor]:
    """Each context's tail after ``prefix``: its keys and values ((2, layers, kv_heads, T,
    head_dim) each) and its next-token logits (U, V)."""
    kvs: list[Tensor] = []
    logits: list[Tensor] = []
    for start in range(0, len(contexts), TAIL_ROWS_PER_FORWARD):
        chunk = contexts[start : start + TAIL_ROWS_PER_FORWARD]
        chunk_kv, chunk_logits = _tail_forward(model, prefix, chunk, pad_id)
        kvs += chunk_kv
        logits.append(chunk_logits)
    return kvs, torch.cat(logits)


def _tail_forward(
    model: PreTrainedModel, prefix: SharedPrefix, contexts: Sequence[Context], pad_id: int
) -> tuple[list[Tensor], Tensor]:
    shared = len(prefix.tokens)
    tails = [context[shared:] for context in contexts]
    rows, width = len(tails), max(len(tail) for tail in tails)
    device = prefix.keys.device
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    tail_mask = torch.zeros((rows, width), dtype=torch.long)
    for i, tail in enumerate(tails):  # left-padded: every tail ends at the last column
        ids[i, width - len(tail) :] = torch.tensor(tail)
        tail_mask[i, width - len(tail) :] = 1
    ids, tail_mask = ids.to(device), tail_mask.to(device)
    mask = torch.cat([tail_mask.new_ones((rows, shared)), tail_mask], dim=1)  # (U, P + W)
    positions = (shared + tail_mask.cumsum(dim=1) - 1).clamp(min=shared)  # (U, W)
    cache = DynamicCache(config=model.config)
    for layer in range(prefix.keys.shape[0]):
        keys = prefix.keys[layer].unsqueeze(0).expand(rows, -1, -1, -1).contiguous()
        values = prefix.values[layer].unsqueeze(0).expand(rows, -1, -1, -1).contiguous()
        cache.update(keys, values, layer)  # (U, kv_heads, P, head_dim)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    kvs = [context_kv(cache, i, len(tail)) for i, tail in enumerate(tails)]
    return kvs, out.logits[:, -1, :]
