"""What a speed figure depends on: the CPU model, its cores and its vector extensions."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")
"""The extensions CPU inference kernels (ours through torch/oneDNN, vLLM-CPU's) look for."""


def cpu_facts(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The CPU model, its cores, which of ``FLAGS`` it has and which it lacks."""
    model, flags = "", set()
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {
        "model": model or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "flags": [f for f in FLAGS if f in flags],
        "lacks": [f for f in FLAGS if f not in flags],
    }
