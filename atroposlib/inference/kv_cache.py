"""The decode-time key/value cache of the fast path: shared prompts once, private tails per row.

A group of ``n`` samples of one prompt (GRPO's 16-sample groups, ``n > 1`` requests) keeps
the prompt's keys and values once (a :class:`SharedPrefix`); each row keeps only what is
its own (its generated tokens; the whole context for a row without a shared prompt) in a
preallocated buffer, written in place at each step instead of concatenated. Attention of
one decode step reads the shared prompt once per group (a matrix product for all the
group's rows) and each row's private part:

    scores = [q . K_prefix | q . K_private]   softmax over both   out = p_pre V_pre + p_priv V_priv

which is the same softmax as over the concatenated context (float rounding aside).

Row order can change when rows leave (:meth:`PrefixSharedCache.keep` moves the last rows
into the holes, so only moved rows are copied); the batch reorders its rows to match.

A step may compute only some rows (:meth:`PrefixSharedCache.select`): rows whose contexts are
the same so far (a group's samples before they diverge) have the same keys, values and
logits, so one of them is computed and the others get its keys and values written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

_ROW_CHUNK = 8
_LENGTH_CHUNK = 64


@dataclass
class SharedPrefix:
    """One context's keys and values, read by every row that continues it."""

    tokens: tuple[int, ...]
    keys: Tensor  # (layers, kv_heads, P, head_dim)
    values: Tensor
    generation: int
    """The weights that computed it (:attr:`ModelRunner.weights_generation`)."""
    last_logits: Tensor | None
    """(V,): the distribution of the token after it, for rows that join later (None for a
    beginning cut from a longer prefix: only continued, never sampled from)."""

    def cut(self, length: int) -> SharedPrefix:
        """Its first ``length`` tokens, their keys and values a view of these."""
        return SharedPrefix(
            self.tokens[:length],
            self.keys[:, :, :length],
            self.values[:, :, :length],
            self.generation,
            None,
        )

    def extended(self, tokens: tuple[int, ...], tail: Tensor, last_logits: Tensor) -> SharedPrefix:
        """``tokens``: these followed by a tail whose keys and values are ``tail``
        (2, layers, kv_heads, T, head_dim); a copy, so it outlives the batch that ran it."""
        return SharedPrefix(
            tokens,
            torch.cat([self.keys, tail[0]], dim=2),
            torch.cat([self.values, tail[1]], dim=2),
            self.generation,
            last_logits.clone(),
        )


class PrefixSharedCache:
    """Keys/values of a batch's rows: :class:`SharedPrefix` objects plus private buffers."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.keys = torch.empty((layers, 0, kv_heads, 0, head_dim), dtype=dtype, device=device)
        self.values = torch.empty_like(self.keys)
        self.lengths = torch.zeros(0, dtype=torch.long, device=device)  # private tokens per row
        self.prefix_of: list[SharedPrefix | None] = []
        self._groups: list[tuple[SharedPrefix, Tensor]] | None = None  # prefix, its rows
        self._selected: Tensor | None = None  # the rows this step computes (None: all)

    def __len__(self) -> int:
        return len(self.prefix_of)

    @torch.inference_mode()  # the buffers are inference tensors, changed in place
    def add_rows(self, prefixes: list[SharedPrefix | None], private: list[Tensor | None]) -> None:
        """Append rows: each continues ``prefixes[i]`` (or nothing) and holds ``private[i]``
        ((2, layers, kv_heads, L, head_dim): its own keys and values so far, or nothing)."""
        first = len(self)
        lengths = [0 if kv is None else kv.shape[3] for kv in private]
        self._reserve(first + len(private), max(lengths, default=0))
        for i, kv in enumerate(private):
            if kv is not None:
                self.keys[:, first + i, :, : lengths[i]] = kv[0]
                self.values[:, first + i, :, : lengths[i]] = kv[1]
        added = torch.tensor(lengths, dtype=torch.long, device=self.device)
        self.lengths = torch.cat([self.lengths, added])
        self.prefix_of += prefixes
        self._forget_selection()

    @torch.inference_mode()  # the buffers are inference tensors, changed in place
    def absorb(self, other: PrefixSharedCache) -> None:
        """Append every row of ``other`` (a batch joining this one)."""
        first, joining = len(self), len(other)
        length = int(other.lengths.max()) if joining else 0
        self._reserve(first + joining, length)
        rows = slice(first, first + joining)
        self.keys[:, rows, :, :length] = other.keys[:, :joining, :, :length]
        self.values[:, rows, :, :length] = other.values[:, :joining, :, :length]
        self.lengths = torch.cat([self.lengths, other.lengths])
        self.prefix_of += other.prefix_of
        self._forget_selection()

    @torch.inference_mode()  # the buffers are inference tensors, changed in place
    def keep(self, indices: list[int]) -> list[int]:
        """Keep the rows at ``indices``; the new row order, as indices of the old rows.

        The last kept rows move into the holes the others leave (only they are copied)."""
        kept = sorted(indices)
        count = len(kept)
        staying = set(kept)
        holes = [i for i in range(count) if i not in staying]
        movers = [i for i in kept if i >= count]
        order = list(range(count))
        if holes:
            source = torch.tensor(movers, device=self.device)
            target = torch.tensor(holes, device=self.device)
            length = int(self.lengths[source].max())
            self.keys[:, target, :, :length] = self.keys[:, source, :, :length]
            self.values[:, target, :, :length] = self.values[:, source, :, :length]
            self.lengths[target] = self.lengths[source]
            for hole, mover in zip(holes, movers, strict=True):
                order[hole] = mover
                self.prefix_of[hole] = self.prefix_of[mover]
        self.lengths = self.lengths[:count].clone()
        del self.prefix_of[count:]
        self._forget_selection()
        return order

    def prefixes(self) -> list[SharedPrefix]:
        """The shared prefixes some row continues (each once)."""
        seen: dict[int, SharedPrefix] = {}
        for prefix in self.prefix_of:
            if prefix is not None:
                seen.setdefault(id(prefix), prefix)
        return list(seen.values())

    def select(self, rows: Tensor | None) -> None:
        """The rows this step's :meth:`attend` computes, in order (None: every row)."""
        if rows is None and self._selected is None:
            return
        self._selected = rows
        self._groups = None

    def _forget_selection(self) -> None:
        self._selected = None
        self._groups = None

    def write(self, layer: int, keys: Tensor, values: Tensor) -> None:
        """Store each row's new key/value ((B, kv_heads, head_dim)) after its private part."""
        rows = torch.arange(len(self), device=self.device)
        self.keys[layer, rows, :, self.lengths] = keys
        self.values[layer, rows, :, self.lengths] = values

    def reserve_step(self) -> None:
        """Room for one more private token per row (call before a step's :meth:`write`)."""
        longest = int(self.lengths.max()) if len(self) else 0
        self._reserve(len(self), longest + 1)

    def advance(self) -> None:
        """Count the token written by this step's :meth:`write` calls."""
        self.lengths += 1

    def attend(self, layer: int, query: Tensor, scale: float) -> Tensor:
        """Attention of each selected row's query ((B, heads, head_dim); B the rows
        :meth:`select` chose, else every row) over its prefix and its private tokens, the one
        just written included; (B, heads, head_dim)."""
        rows, heads, dim = query.shape
        kv_heads = self.shape[1]
        group = heads // kv_heads
        q = query.view(rows, kv_heads, group, dim)
        lengths = self.lengths if self._selected is None else self.lengths[self._selected]
        span = int(lengths.max()) + 1
        if self._selected is None:
            own_keys = self.keys[layer, :rows, :, :span]
            own_values = self.values[layer, :rows, :, :span]
        else:
            own_keys = self.keys[layer, :, :, :span][self._selected]
            own_values = self.values[layer, :, :, :span][self._selected]
        own = torch.matmul(q, own_keys.transpose(-1, -2))  # (B, kv_heads, group, span)
        unused = torch.arange(span, device=self.device)[None, :] > lengths[:, None]
        own.masked_fill_(unused[:, None, None, :], float("-inf"))
        groups = self._prefix_groups()
        if not groups:
            probs = _softmax(own.mul_(scale))
            return torch.matmul(probs, own_values).view(rows, heads, dim)
        longest = max(prefix.keys.shape[2] for prefix, _ in groups)
        shared = own.new_full((rows, kv_heads, group, longest), float("-inf"))
        for prefix, members in groups:
            length, n = prefix.keys.shape[2], len(members)
            q_shared = q[members].permute(1, 0, 2, 3).reshape(kv_heads, n * group, dim)
            scores = torch.matmul(q_shared, prefix.keys[layer].transpose(-1, -2))
            shared[members, :, :, :length] = scores.view(kv_heads, n, group, length).transpose(0, 1)
        probs = _softmax(torch.cat([shared, own], dim=-1).mul_(scale))
        out = torch.matmul(probs[..., longest:], own_values)  # (B, kv_heads, group, dim)
        for prefix, members in groups:
            length, n = prefix.keys.shape[2], len(members)
            p = probs[members, :, :, :length].transpose(0, 1).reshape(kv_heads, n * group, length)
            mixed = torch.matmul(p, prefix.values[layer]).view(kv_heads, n, group, dim)
            out[members] += mixed.transpose(0, 1)
        return out.view(rows, heads, dim)

    def _prefix_groups(self) -> list[tuple[SharedPrefix, Tensor]]:
        """Each prefix the computed rows continue, with their positions among those rows."""
        if self._groups is None:
            rows = range(len(self)) if self._selected is None else self._selected.tolist()
            members: dict[int, tuple[SharedPrefix, list[int]]] = {}
            for position, row in enumerate(rows):
                prefix = self.prefix_of[row]
                if prefix is not None:
                    members.setdefault(id(prefix), (prefix, []))[1].append(position)
            self._groups = [
                (prefix, torch.tensor(positions, device=self.device))
                for prefix, positions in members.values()
            ]
        return self._groups

    def _reserve(self, rows: int, length: int) -> None:
        """Grow the private buffers (in chunks, so growth is rare) to ``rows`` x ``length``."""
        have_rows, have_length = self.keys.shape[1], self.keys.shape[3]
        if rows <= have_rows and length <= have_length:
            return
        new_rows = max(have_rows, _round_up(rows, _ROW_CHUNK))
        new_length = have_length
        if length > have_length:
            new_length = max(_round_up(length, _LENGTH_CHUNK), 2 * have_length)
        layers, kv_heads, dim = self.shape
        shape = (layers, new_rows, kv_heads, new_length, dim)
        # zeros, not empty: masked-out columns still meet a zero probability in p @ V, and
        # 0 * NaN (uninitialised memory) would be NaN
        keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        used = len(self)
        keys[:, :used, :, :have_length] = self.keys[:, :used]
        values[:, :used, :, :have_length] = self.values[:, :used]
        self.keys, self.values = keys, values


def _softmax(scores: Tensor) -> Tensor:
    """Softmax in float32 whatever the cache's dtype (as attention kernels accumulate)."""
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(scores.dtype)


def _round_up(value: int, chunk: int) -> int:
    return max(chunk, -(-value // chunk) * chunk)
