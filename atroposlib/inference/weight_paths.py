"""Which folders ``/update_weights_from_disk`` and ``/v1/load_lora_adapter`` may load.

A path is taken only when, with its links resolved, it lies under one of the server's
``--weight-roots`` and holds safetensors weights. A path that does not exist and one outside the
roots get the same answer, so the routes never tell a caller whether some path on the machine
exists; inside the roots the answer names what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from atroposlib.inference.weight_transfer import TransferError

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def _resolved_under(path: str, roots: Sequence[Path], field: str) -> Path:
    """``path`` with its links resolved, when that lies under a root and is a folder."""
    unknown = TransferError(
        field, "no checkpoint folder of this name under the server's --weight-roots"
    )
    if not roots:
        raise TransferError(
            field, "the server loads no weights from disk; start it with --weight-roots"
        )
    try:  # a NUL byte, a name too long for the OS: no folder by that name either
        resolved = Path(os.path.realpath(path))
        inside = any(resolved.is_relative_to(os.path.realpath(root)) for root in roots)
        if not inside or not resolved.is_dir():
            raise unknown
    except (ValueError, OSError) as error:
        raise unknown from error
    return resolved


def model_folder(path: str, roots: Sequence[Path], field: str = "model_path") -> Path:
    """A checkpoint folder under ``roots`` holding ``*.safetensors`` weights and config.json."""
    folder = _resolved_under(path, roots, field)
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        raise TransferError(
            field, "the folder holds no config.json and *.safetensors weights (safetensors only)"
        )
    return folder


def adapter_folder(path: str, roots: Sequence[Path], field: str = "lora_path") -> Path:
    """A PEFT adapter folder under ``roots`` saved as safetensors."""
    folder = _resolved_under(path, roots, field)
    missing = [name for name in ADAPTER_FILES if not (folder / name).is_file()]
    if missing:
        raise TransferError(
            field, f"the folder has no {' or '.join(missing)} (PeftModel.save_pretrained, "
            "safetensors only)",
        )  # fmt: skip
    return folder
