"""A running batch of sequences and their key/value cache.

Rows can join and leave between decode steps, which is what lets new requests start
while others are still generating. Two caches: :class:`PaddedCache` (transformers' own,
left-padded; any architecture) and the fast path's
:class:`~atroposlib.inference.kv_cache.PrefixSharedCache`.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from transformers import DynamicCache

from atroposlib.inference.kv_cache import PrefixSharedCache
from atroposlib.inference.sampling import SamplingParams

_TWIN_IDS = itertools.count()


def new_twin_id() -> int:
    return next(_TWIN_IDS)


class Sequence:
    """One generated sequence: its prompt, settings, and what has been produced so far."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.generator: torch.Generator | None = None  # seeded on the model's device at prefill
        self.output_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_logprobs: list[list[tuple[int, float]]] = []
        self.finish_reason: str | None = None
        self.matched_stop: str | int | None = None
        self.text: str = ""
        self.weight_version = 0
        """The weight version when the sequence was admitted (its first token's)."""
        self.version_starts: list[tuple[int, int]] = []
        """``(weight version, index of the first output token it sampled)``, one per change."""
        self.twin = new_twin_id()
        """Rows of a batch with the same ``twin`` have the same context and the same cached
        keys and values so far (a group's samples until they diverge): one is computed."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def note_version(self, version: int) -> None:
        """Record that the newest output token was sampled by ``version``."""
        if not self.version_starts or self.version_starts[-1][0] != version:
            self.version_starts.append((version, len(self.output_ids) - 1))

    def version_spans(self) -> list[tuple[int, int, int]]:
        """``(version, start, end)``: output tokens ``[start, end)`` came from ``version``."""
        ends = [start for _, start in self.version_starts[1:]] + [len(self.output_ids)]
        return [(v, s, e) for (v, s), e in zip(self.version_starts, ends, strict=True)]

    @property
    def context_ids(self) -> list[int]:
        """What the model has to have seen to sample the next token: prompt, then output."""
        return self.prompt_ids + self.output_ids


class PaddedCache:
    """A transformers cache of left-padded rows (the path for any architecture): every row's
    cache ends at the same column; ``attention_mask`` (B, L) marks the real tokens."""

    def __init__(self, cache: DynamicCache, attention_mask: torch.Tensor) -> None:
        self.cache = cache
        self.attention_mask = attention_mask

    def __len__(self) -> int:
        return int(self.attention_mask.shape[0])

    @property
    def length(self) -> int:
        return int(self.attention_mask.shape[1])

    def keep(self, indices: list[int]) -> list[int]:
        """Keep the rows at ``indices`` (in that order), then trim unused columns."""
        index = torch.tensor(indices, dtype=torch.long, device=self.attention_mask.device)
        self.cache.batch_select_indices(index)
        self.attention_mask = self.attention_mask[index]
        used = self.attention_mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else self.length
        if first > 0:
            for layer in _layers(self.cache):
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]
            self.attention_mask = self.attention_mask[:, first:]
        return indices

    def absorb(self, other: PaddedCache) -> None:
        """Append ``other``'s rows, left-padding whichever cache is shorter."""
        width = max(self.length, other.length)
        self._pad_left(width - self.length)
        other._pad_left(width - other.length)
        for mine, theirs in zip(_layers(self.cache), _layers(other.cache), strict=True):
            mine.keys = torch.cat([mine.keys, theirs.keys], dim=0)
            mine.values = torch.cat([mine.values, theirs.values], dim=0)
        self.attention_mask = torch.cat([self.attention_mask, other.attention_mask], dim=0)

    def grow(self) -> None:
        """One more column for the token the next step feeds."""
        ones = self.attention_mask.new_ones((len(self), 1))
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)

    def _pad_left(self, columns: int) -> None:
        if columns <= 0:
            return
        for layer in _layers(self.cache):
            keys, values = layer.keys, layer.values
            pad_shape = (*keys.shape[:2], columns, keys.shape[3])
            layer.keys = torch.cat([keys.new_zeros(pad_shape), keys], dim=2)
            layer.values = torch.cat([values.new_zeros(pad_shape), values], dim=2)
        pad = self.attention_mask.new_zeros((len(self), columns))
        self.attention_mask = torch.cat([pad, self.attention_mask], dim=1)


class ActiveBatch:
    """Rows being decoded together, with their cache (:class:`PaddedCache` or
    :class:`~atroposlib.inference.kv_cache.PrefixSharedCache`)."""

    def __init__(
        self,
        rows: list[Sequence],
        cache: PaddedCache | PrefixSharedCache,
        next_tokens: torch.Tensor,
        positions: torch.Tensor,
    ) -> None:
        self.rows = rows
        self.cache = cache
        self.next_tokens = next_tokens  # (B,): sampled, not yet fed through the model
        self.positions = positions  # (B,): position id of next_tokens

    def __len__(self) -> int:
        return len(self.rows)

    def keep(self, indices: list[int]) -> None:
        """Drop every row not in ``indices`` (the cache may reorder the rest)."""
        order = self.cache.keep(indices)
        index = torch.tensor(order, dtype=torch.long, device=self.next_tokens.device)
        self.rows = [self.rows[i] for i in order]
        self.next_tokens = self.next_tokens[index]
        self.positions = self.positions[index]

    def twins(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(``leads``, ``spread``): one row of each set with the same ``twin``, and for each
        row the index in ``leads`` of its set's row; None when fewer than half the rows are
        copies (computing only the leads then saves less than gathering their caches costs)."""
        lead_of: dict[int, int] = {}
        leads: list[int] = []
        spread = []
        for i, row in enumerate(self.rows):
            k = lead_of.setdefault(row.twin, len(leads))
            if k == len(leads):
                leads.append(i)
            spread.append(k)
        if 2 * len(leads) > len(self.rows):
            return None
        device = self.next_tokens.device
        return torch.tensor(leads, device=device), torch.tensor(spread, device=device)

    def merge(self, other: ActiveBatch) -> None:
        """Append ``other``'s rows (its cache is of the same kind)."""
        self.cache.absorb(other.cache)  # type: ignore[arg-type]  # one kind per runner
        self.rows += other.rows
        self.next_tokens = torch.cat([self.next_tokens, other.next_tokens], dim=0)
        self.positions = torch.cat([self.positions, other.positions], dim=0)


def _layers(cache: DynamicCache) -> list[Any]:
    """The per-layer key/value holders (``.keys``/``.values``, each (B, H, L, D))."""
    return list(cache.layers)
