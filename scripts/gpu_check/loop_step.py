"""The loop: ``atropos-local`` with the embedded server and the trainer on the device.

A few steps of the letter-counting env on a small random model (Qwen2-shaped, the test
model's tokenizer): broker, server, env and trainer as processes over HTTP, weights pushed
after every step. A random model earns no reward, so the env sends every group (not only
those whose rewards differ). Asserts: atropos-local exits 0, the trainer made every step, and
the server's weight version read back at the end is the last step.
"""

from __future__ import annotations

import json
import subprocess
import sys

from gpu_check.context import Context

STEPS = 3


def loop(ctx: Context) -> None:
    model_dir = ctx.model("tiny")
    run_dir = ctx.work / "loop"
    argv = [sys.executable, "-m", "atroposlib.cli.local", "--model", str(model_dir),
            "--device", ctx.device, "--run-dir", str(run_dir), "--steps", str(STEPS),
            "--eval-size", "0", "--batch-size", "8", "--group-size", "4",
            "--env-script", "environments/letter_counting/env.py",
            "--env-config", "environments/letter_counting/config.yaml",
            "--env-args", '["--env.ensure_scores_are_not_same", "false"]',
            "--no-panel", "--progress-interval-s", "5"]  # fmt: skip
    with ctx.timed() as seconds:
        finished = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    metrics = run_dir / "metrics.jsonl"
    steps = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    version = summary.get("final_weight_version")
    ctx.result.add(loop_s=seconds[0], trainer_steps=steps, final_weight_version=version,
                   output_tail=(finished.stdout + finished.stderr)[-1500:])  # fmt: skip
    ctx.result.check("loop: atropos-local exit code", finished.returncode == 0,
                     finished.returncode, "0")  # fmt: skip
    ctx.result.check("loop: trainer steps", steps >= STEPS, steps, f">= {STEPS}")
    ctx.result.check("loop: weight version read back", str(version) == str(STEPS), version,
                     str(STEPS))  # fmt: skip
