"""LoRA adapters for the embedded server, merged into the base weights on load.

``POST /v1/load_lora_adapter`` takes vLLM's body, but the embedded server runs one set of
weights at a time: the adapter is merged into a fresh copy of the base weights (the folder
last loaded in full: ``--model`` or ``update_weights_from_disk``), which then replace the
served weights exactly as a full reload does (``weight_version`` increments, requests in
flight finish first). The adapter's name becomes another name for the served model. Loading
another adapter merges it into the base again: adapters replace each other, never stack.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import PreTrainedModel

from atroposlib.inference.engine import load_model

logger = logging.getLogger(__name__)


def load_merged(
    base_path: str | Path, lora_path: str | Path, device: str, dtype: torch.dtype
) -> PreTrainedModel:
    """The base model with the PEFT adapter at ``lora_path`` merged into its weights (the
    route has checked that it is saved as safetensors: :func:`weight_paths.adapter_folder`)."""
    from peft import PeftModel

    adapter = Path(lora_path)
    if not (adapter / "adapter_config.json").is_file():
        raise FileNotFoundError(
            f"lora_path {str(lora_path)!r} has no adapter_config.json; point it at a folder "
            "written by PeftModel.save_pretrained"
        )
    base = load_model(base_path, device, dtype)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    logger.info("merged LoRA adapter %s into %s", adapter, base_path)
    return merged.eval()
