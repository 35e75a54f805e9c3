"""One step in its own process: ``python -m gpu_check.step NAME --device D --work W --result R``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from gpu_check import loop_step, server_steps, trainer_steps
from gpu_check.context import Context
from gpu_check.results import Result

STEPS = {
    "trainer_modes": trainer_steps.modes,
    "trainer_lora": trainer_steps.lora,
    "trainer_fsdp2": trainer_steps.fsdp2,
    "server_logprobs": server_steps.logprobs,
    "weight_push": server_steps.weight_push,
    "server_throughput": server_steps.throughput,
    "loop": loop_step.loop,
    "trainer_1.5b": lambda ctx: trainer_steps.modes(ctx, "qwen2.5-1.5b-like", ("packed",)),
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="gpu_check.step")
    parser.add_argument("name", choices=sorted(STEPS))
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--peak-tflops", type=float, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ctx = Context(args.device, args.work, args.tokenizer, Result(args.result), args.peak_tflops)
    STEPS[args.name](ctx)


if __name__ == "__main__":
    main()
