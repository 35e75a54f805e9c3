"""The number format of a local run's model: bf16 where the CPU computes it natively.

On a CPU with bf16 dot-product instructions (AVX512-BF16, AMX) the embedded server's decode and
the trainer's forward and backward run about twice the multiply-adds per cycle in bf16 as in
fp32; elsewhere bf16 is emulated and slower than fp32. ``auto`` therefore picks bf16 on such a
CPU (the server's weights, the trainer's autocast, its logits in fp32) and otherwise leaves
both to their own default (fp32 on a CPU, bf16 on a GPU). The trainer's ratio uses its own
logprobs, so the server's format changes only what is sampled, not the loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of the CPUs that compute bf16 products natively."""

CPUINFO = Path("/proc/cpuinfo")

Precision = Literal["auto", "fp32", "bf16"]


def cpu_flags(cpuinfo: Path | None = None) -> set[str]:
    """The first CPU's flags (none where the file is missing: not Linux)."""
    try:
        text = (cpuinfo or CPUINFO).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def native_bf16_cpu(cpuinfo: Path | None = None) -> bool:
    return any(flag in cpu_flags(cpuinfo) for flag in NATIVE_BF16_FLAGS)


@dataclass(frozen=True)
class RunPrecision:
    """What ``--precision`` becomes on each process's command line."""

    name: Precision
    """``bf16`` or ``fp32`` when chosen; ``auto`` leaves each process its own default."""

    @property
    def server_dtype(self) -> str:
        """``--dtype`` of the embedded server."""
        return {"bf16": "bfloat16", "fp32": "float32"}.get(self.name, "auto")

    @property
    def trainer_args(self) -> list[str]:
        if self.name == "bf16":
            return ["--precision", "bf16", "--fp32-logits"]
        return ["--precision", self.name]


def resolve_precision(
    choice: Precision, inference: str, cpuinfo: Path | None = None
) -> RunPrecision:
    """``auto`` is bf16 with the embedded server on a CPU with native bf16; vLLM's tier keeps
    its fp32 (the format its token-exactness was measured in) unless bf16 is asked for."""
    if choice == "auto" and inference == "embedded" and native_bf16_cpu(cpuinfo):
        return RunPrecision("bf16")
    return RunPrecision(choice)
