"""The table on stdout: one line per step, with its headline figures and failed checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

HEADLINES = (
    "tokens_per_s", "mfu", "step_s", "peak_memory_gib", "max_abs_delta", "mean_abs_delta",
    "push_s", "loop_s", "final_weight_version", "fsdp_loss",
)  # fmt: skip


SEPARATE = " (checked; the steps use this interpreter's own packages)"


def header(body: dict[str, Any]) -> str:
    m = body["machine"]
    install = body["install"]
    wheels = (
        f"{install['wheels']} wheels installed for CPython {install['for_python']}"
        f"{'' if install['usable'] else SEPARATE}"
        if install["ok"]
        else f"wheel install FAILED: {install['error']}"
    )
    return (
        f"gpu-check on {m.get('gpu') or 'CPU'} ({body['device']}), commit {body['commit']} "
        f"(prepared at {body['prepared_at']})\n"
        f"python {m.get('python')} torch {m.get('torch')} (CUDA {m.get('cuda')}) transformers "
        f"{m.get('transformers')}; {wheels}\n"
        f"{'step':<18} {'status':<9} {'s':>6}  figures"
    )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def row(name: str, what: str, step: dict[str, Any]) -> str:
    figures = step.get("figures", {})
    shown = [
        f"{key}={_fmt(value)}"
        for key, value in figures.items()
        if key.rsplit("/", 1)[-1] in HEADLINES and value is not None
    ]
    line = f"{name:<18} {step['status']:<9} {step.get('seconds', 0):>6.0f}  {what}"
    if shown:
        line += "\n" + " " * 36 + "  ".join(shown)
    if step.get("why"):
        line += "\n" + " " * 36 + f"why: {step['why']}"
    return line


def footer(body: dict[str, Any], json_path: Path) -> str:
    counts: dict[str, int] = {}
    for step in body["steps"].values():
        counts[step["status"]] = counts.get(step["status"], 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in counts.items())
    return f"{summary} in {body['seconds']:.0f} s; every figure: {json_path}"
