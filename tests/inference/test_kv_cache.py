"""The fast path's cache alone (random tensors, no model): attention over a shared prefix
plus private tokens equals plain softmax attention over each row's whole context, through
rows joining, leaving (and being moved into holes) and buffers growing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from atroposlib.inference.kv_cache import PrefixSharedCache, SharedPrefix

LAYERS, KV_HEADS, HEADS, DIM = 2, 2, 6, 8


@pytest.fixture(autouse=True)
def inference_mode() -> Iterator[None]:
    """As in a decode step: the cache's buffers are inference tensors."""
    with torch.inference_mode():
        yield


class Reference:
    """Each row's whole context (prefix then own tokens), kept as plain lists."""

    def __init__(self) -> None:
        self.keys: list[list[torch.Tensor]] = []  # per row, per layer: (kv_heads, L, dim)
        self.values: list[list[torch.Tensor]] = []

    def add(self, prefix: SharedPrefix | None, own: torch.Tensor | None) -> None:
        parts_k = [[] for _ in range(LAYERS)]  # type: list[list[torch.Tensor]]
        parts_v = [[] for _ in range(LAYERS)]  # type: list[list[torch.Tensor]]
        for layer in range(LAYERS):
            if prefix is not None:
                parts_k[layer].append(prefix.keys[layer])
                parts_v[layer].append(prefix.values[layer])
            if own is not None:
                parts_k[layer].append(own[0, layer])
                parts_v[layer].append(own[1, layer])
        empty = torch.zeros(KV_HEADS, 0, DIM)
        self.keys.append([torch.cat([empty, *p], dim=1) for p in parts_k])
        self.values.append([torch.cat([empty, *p], dim=1) for p in parts_v])

    def step(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        for row in range(len(self.keys)):
            self.keys[row][layer] = torch.cat([self.keys[row][layer], keys[row, :, None]], 1)
            self.values[row][layer] = torch.cat([self.values[row][layer], values[row, :, None]], 1)

    def attend(self, layer: int, query: torch.Tensor, scale: float) -> torch.Tensor:
        out = []
        for row in range(len(self.keys)):
            k = self.keys[row][layer].repeat_interleave(HEADS // KV_HEADS, dim=0)
            v = self.values[row][layer].repeat_interleave(HEADS // KV_HEADS, dim=0)
            scores = torch.einsum("hd,hld->hl", query[row], k) * scale
            out.append(torch.einsum("hl,hld->hd", scores.softmax(-1), v))
        return torch.stack(out)

    def keep(self, order: list[int]) -> None:
        self.keys = [self.keys[i] for i in order]
        self.values = [self.values[i] for i in order]


def _prefix(length: int, seed: int) -> SharedPrefix:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(LAYERS, KV_HEADS, length, DIM, generator=g)
    values = torch.randn(LAYERS, KV_HEADS, length, DIM, generator=g)
    return SharedPrefix((seed,) * length, keys, values, 0, torch.zeros(4))


def _own(length: int, seed: int) -> torch.Tensor:
    return torch.randn(
        2, LAYERS, KV_HEADS, length, DIM, generator=torch.Generator().manual_seed(seed)
    )


def _step(cache: PrefixSharedCache, ref: Reference, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    cache.reserve_step()
    for layer in range(LAYERS):
        rows = len(cache)
        keys = torch.randn(rows, KV_HEADS, DIM, generator=g)
        values = torch.randn(rows, KV_HEADS, DIM, generator=g)
        query = torch.randn(rows, HEADS, DIM, generator=g)
        cache.write(layer, keys, values)
        ref.step(layer, keys, values)
        got = cache.attend(layer, query, 0.3)
        assert torch.allclose(got, ref.attend(layer, query, 0.3), atol=1e-5)
    cache.advance()


def test_shared_prefix_attention_equals_attention_over_each_whole_context() -> None:
    cache = PrefixSharedCache(LAYERS, KV_HEADS, DIM, torch.float32, torch.device("cpu"))
    ref = Reference()
    a, b = _prefix(5, 1), _prefix(9, 2)
    rows: list[tuple[SharedPrefix | None, torch.Tensor | None]] = [
        (a, None), (a, None), (None, _own(7, 3)), (b, None), (a, None), (b, None),
    ]  # fmt: skip
    cache.add_rows([p for p, _ in rows], [o for _, o in rows])
    for prefix, own in rows:
        ref.add(prefix, own)
    for step in range(3):
        _step(cache, ref, 100 + step)
    # rows 0 and 3 leave: rows 4 and 5 move into their places
    order = cache.keep([1, 2, 4, 5])
    assert sorted(order) == [1, 2, 4, 5] and order != [1, 2, 4, 5]
    ref.keep(order)
    _step(cache, ref, 200)
    # a joining batch: a new prefix, a private row, and a row of a running prefix
    other = PrefixSharedCache(LAYERS, KV_HEADS, DIM, torch.float32, torch.device("cpu"))
    c = _prefix(3, 4)
    joining: list[tuple[SharedPrefix | None, torch.Tensor | None]] = [
        (c, None), (None, _own(2, 5)), (b, None), (c, None),
    ]  # fmt: skip
    other.add_rows([p for p, _ in joining], [o for _, o in joining])
    cache.absorb(other)
    for prefix, own in joining:
        ref.add(prefix, own)
    assert {id(p) for p in cache.prefixes()} == {id(a), id(b), id(c)}
    for step in range(70):  # past the first length chunk: the buffers grow
        _step(cache, ref, 300 + step)
        if step == 30:  # the last row leaves: nothing moves
            assert cache.keep([0, 1, 2, 3, 4, 5, 6]) == list(range(7))
            ref.keep(list(range(7)))
    assert cache.keys.shape[3] >= 7 + 70 + 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_columns_of_fresh_buffers_never_reach_the_output(dtype: torch.dtype) -> None:
    """Columns past a row's length hold whatever an earlier row left (or zeros): they must
    get probability 0, whatever their keys, and add nothing."""
    cache = PrefixSharedCache(1, 1, 4, dtype, torch.device("cpu"))
    cache.add_rows([None, None], [torch.ones(2, 1, 1, 6, 4, dtype=dtype), None])
    cache.keep([1])  # row 1 moves into row 0's slot, over six stale columns
    cache.keys[0, 0, :, 1:].fill_(1e4)
    cache.values[0, 0, :, 1:].fill_(1e4)
    cache.reserve_step()
    cache.write(0, torch.full((1, 1, 4), 0.5, dtype=dtype), torch.full((1, 1, 4), 2.0, dtype=dtype))
    out = cache.attend(0, torch.ones(1, 1, 4, dtype=dtype), 1.0)
    assert out.tolist() == [[[2.0, 2.0, 2.0, 2.0]]]
