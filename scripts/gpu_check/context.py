"""What every step gets: the device, a scratch folder shared by the steps, the tokenizer, and
the result it writes into."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_check import shapes
from gpu_check.results import Result

PEAK_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.4,
    "A100": 312.0,
    "L40S": 362.1,
    "L4": 121.0,
}
"""Dense bf16 tensor-core peaks (vendor data sheets, TFLOP/s), matched in this order against the
device name; a card not listed gets no MFU unless ``--peak-tflops`` names its peak."""


@dataclass
class Context:
    device: str
    work: Path
    tokenizer: Path
    result: Result
    peak_tflops: float | None = None

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    def model(self, shape_name: str) -> Path:
        """The model folder of ``shape_name`` (built once, shared by the steps)."""
        if not self.gpu:
            shape_name = "tiny"
        folder = self.work / "models" / shape_name
        folder.parent.mkdir(parents=True, exist_ok=True)
        return shapes.build(shapes.SHAPES[shape_name], self.tokenizer, folder, self.device)

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()

    def peak(self) -> float | None:
        if self.peak_tflops or not self.gpu:
            return self.peak_tflops
        name = torch.cuda.get_device_name()
        return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)

    @contextmanager
    def timed(self) -> Iterator[list[float]]:
        """``with ctx.timed() as t: ...`` then ``t[0]`` is the seconds, the device synced."""
        box: list[float] = []
        self.sync()
        start = time.perf_counter()
        yield box
        self.sync()
        box.append(time.perf_counter() - start)

    def reset_peak_memory(self) -> None:
        if self.gpu:
            torch.cuda.reset_peak_memory_stats()

    def peak_memory_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / 2**30 if self.gpu else None
