"""Models of real shapes, built from a config in code with random weights (none travel).

Qwen2.5-0.5B's and -1.5B's layers and widths, with the test model's tokenizer (SmolLM2's
49,152-token vocabulary: Qwen's tokenizer does not travel), so the embedded server and the
envs can encode and decode. The final norm is scaled so the next-token distribution is peaked
like a trained model's (at the default init it is almost uniform over the vocabulary, which
would hide logprob mismatches).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

NORM_SCALE = 8.0
"""Final RMSNorm weight: logits get a std of about NORM_SCALE x 0.02 x sqrt(hidden)."""


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


SHAPES = {
    "qwen2.5-0.5b-like": Shape("qwen2.5-0.5b-like", 896, 24, 14, 2, 4864),
    "qwen2.5-1.5b-like": Shape("qwen2.5-1.5b-like", 1536, 28, 12, 2, 8960),
    "tiny": Shape("tiny", 64, 2, 4, 2, 128),
}


def build(shape: Shape, tokenizer_dir: Path, dest: Path, device: str, seed: int = 0) -> Path:
    """A random-initialised Qwen2 model of ``shape`` saved (bf16) with the tokenizer at ``dest``."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    if (dest / "config.json").exists():
        return dest
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.norm.weight.fill_(NORM_SCALE)
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(staging)
    for source in tokenizer_dir.iterdir():
        shutil.copy2(source, staging / source.name)
    staging.rename(dest)
    return dest


def body_parameters(model: torch.nn.Module) -> int:
    """Parameters in the per-position matrix products: all but the vocabulary matrix (tied:
    the embedding lookup is no product; the output projection is counted per logit row)."""
    total = sum(p.numel() for p in model.parameters())
    return total - model.get_input_embeddings().weight.numel()  # type: ignore[operator]
