"""One decode step of a Llama-style model over a :class:`PrefixSharedCache`, without the
transformers forward.

The step calls the model's own modules (embedding, norms, projections, rotary embedding,
MLP, head) in the order the transformers forward does, so the arithmetic per row is the
same; what changes is the attention (see :mod:`atroposlib.inference.kv_cache`: shared
prompts read once, keys written in place) and what is skipped: the 4-D mask built every
step, the cache concatenation, the per-layer keyword plumbing. Architectures it does not
know keep the transformers forward (:func:`supports`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from atroposlib.inference.kv_cache import PrefixSharedCache

_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2"})
"""Pre-norm decoder layers (``input_layernorm``, ``self_attn`` with q/k/v/o projections
and rotary positions, ``post_attention_layernorm``, ``mlp``), full attention."""


def supports(model: PreTrainedModel) -> bool:
    """Whether :func:`decode_step` computes what ``model``'s own forward computes."""
    config = model.config
    if getattr(config, "model_type", None) not in _ARCHITECTURES:
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        if any(kind != "full_attention" for kind in layer_types):
            return False
    elif getattr(config, "sliding_window", None) is not None:
        return False
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if inner is None or not layers or getattr(inner, "rotary_emb", None) is None:
        return False
    attention = layers[0].self_attn
    needed = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
    return all(hasattr(attention, name) for name in needed)


def empty_cache(model: PreTrainedModel, device: torch.device) -> PrefixSharedCache:
    config = model.config
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    dtype = model.dtype
    return PrefixSharedCache(int(config.num_hidden_layers), kv_heads, head_dim, dtype, device)


def context_kv(cache: DynamicCache, row: int, length: int) -> Tensor:
    """Row ``row``'s last ``length`` cached positions of a (left-padded) prefill cache, all
    layers: (2, layers, kv_heads, length, head_dim)."""
    layers: list[Any] = list(cache.layers)
    keys = torch.stack([layer.keys[row, :, -length:] for layer in layers])
    values = torch.stack([layer.values[row, :, -length:] for layer in layers])
    return torch.stack([keys, values])


@torch.inference_mode()
def decode_step(
    model: PreTrainedModel,
    cache: PrefixSharedCache,
    tokens: Tensor,
    positions: Tensor,
    twins: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Feed ``tokens`` (B,) at ``positions`` (B,); the next-token logits (B, V).

    ``twins`` (``leads``, ``spread``): only the rows ``leads`` are computed, and row ``i``
    gets the keys and values of row ``leads[spread[i]]`` (rows whose contexts are the same so
    far); the logits are then (len(leads), V), one per computed row.
    """
    inner = model.model
    if twins is not None:
        leads, spread = twins
        tokens, positions = tokens[leads], positions[leads]
    cache.select(None if twins is None else twins[0])
    rows = len(tokens)
    hidden = inner.embed_tokens(tokens[:, None])  # (B, 1, H)
    cos, sin = inner.rotary_emb(hidden, positions[:, None])  # (B, 1, head_dim)
    cache.reserve_step()
    for index, layer in enumerate(inner.layers[: model.config.num_hidden_layers]):
        attention = layer.self_attn
        head_dim = attention.head_dim
        x = layer.input_layernorm(hidden)
        query = _rotate(attention.q_proj(x).view(rows, -1, head_dim), cos, sin)
        key = _rotate(attention.k_proj(x).view(rows, -1, head_dim), cos, sin)
        value = attention.v_proj(x).view(rows, -1, head_dim)
        if twins is not None:
            key, value = key[spread], value[spread]
        cache.write(index, key, value)
        mixed = cache.attend(index, query, attention.scaling)  # (B, heads, head_dim)
        hidden = hidden + attention.o_proj(mixed.reshape(rows, 1, -1))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    cache.advance()
    logits: Tensor = model.lm_head(inner.norm(hidden))
    return logits[:, 0, :]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary position embedding of ``x`` (B, heads, head_dim), as transformers applies it."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
