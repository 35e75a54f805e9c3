"""Which folders ``/update_weights_from_disk`` and ``/v1/load_lora_adapter`` may load.

A path is taken only when, with its links resolved, it lies under one of the server's
``--weight-roots`` and holds safetensors weights, and so does every file the loader may open:
each entry of the folder (config, weights, index, adapter files) and each shard a
``*.index.json`` names, links resolved one by one. A path that does not exist, one outside the
roots and a folder with a file linking out of them get the same answer, so the routes never
tell a caller whether some path on the machine exists; inside the roots the answer names what
is missing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from atroposlib.inference.weight_transfer import TransferError

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
MAX_FOLDER_ENTRIES = 10_000
"""A checkpoint folder holds tens of files; one with more is refused rather than walked."""
MAX_INDEX_BYTES = 64 * 2**20


def _resolved_under(path: str, roots: Sequence[Path], field: str) -> Path:
    """``path`` with its links resolved, when that lies under a root and is a folder whose
    entries (and the shards its indexes name) all resolve under a root too."""
    unknown = TransferError(
        field, "no checkpoint folder of this name under the server's --weight-roots"
    )
    if not roots:
        raise TransferError(
            field, "the server loads no weights from disk; start it with --weight-roots"
        )
    try:  # a NUL byte, a name too long for the OS: no folder by that name either
        real_roots = [Path(os.path.realpath(root)) for root in roots]
        resolved = Path(os.path.realpath(path))
        if not _inside(resolved, real_roots) or not resolved.is_dir():
            raise unknown
        if not all(_inside(Path(os.path.realpath(f)), real_roots) for f in _loadable(resolved)):
            raise unknown
    except (ValueError, OSError) as error:
        raise unknown from error
    return resolved


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def _loadable(folder: Path) -> list[Path]:
    """Every file a loader may open from ``folder``: its entries, and the shards named by its
    ``*.index.json`` files (joined to the folder, as transformers does, so ``../x`` counts)."""
    entries = []
    with os.scandir(folder) as scan:
        for entry in scan:
            entries.append(folder / entry.name)
            if len(entries) > MAX_FOLDER_ENTRIES:
                raise ValueError(f"more than {MAX_FOLDER_ENTRIES} entries")
    shards = []
    for index in (e for e in entries if e.name.endswith(".index.json") and e.is_file()):
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise ValueError(f"{index.name} is larger than {MAX_INDEX_BYTES} bytes")
        document = json.loads(index.read_bytes())
        weight_map = document.get("weight_map") if isinstance(document, dict) else None
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index.name} has no weight_map object")
        shards += [folder / str(name) for name in weight_map.values()]
    return entries + shards


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
