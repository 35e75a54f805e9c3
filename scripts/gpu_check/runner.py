"""``run``: install the wheels, then every step in its own process, most important first.

A step gets at most its own time limit and never more than what is left of ``--budget-s``; a
step that fails, crashes or runs out of time is recorded and the next one starts. One table on
stdout and ``DIR/gpu-check.json`` (device, versions, every figure and check); the steps' output
goes to ``DIR/gpu-check.log``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu_check import install, report


@dataclass(frozen=True)
class Step:
    name: str
    what: str
    limit_s: int  # on a GPU; on CPU every step gets CPU_LIMIT_S


PLAN = (
    Step("trainer_modes", "GRPO step per micro-batching mode, bf16 vs fp32, MFU", 150),
    Step("server_logprobs", "embedded server's sampled logprobs vs the trainer's", 150),
    Step("weight_push", "trainer -> server pushes (shm, http, disk), checksums", 120),
    Step("loop", "atropos-local, server and trainer on the device", 180),
    Step("trainer_lora", "LoRA step: adapters move, base frozen", 60),
    Step("trainer_fsdp2", "FSDP2 on one rank vs unsharded", 90),
    Step("server_throughput", "embedded server tokens/s: demo mix, 64 concurrent", 120),
    Step("trainer_1.5b", "Qwen2.5-1.5B-like packed step, bf16 vs fp32, MFU", 120),
)
CPU_LIMIT_S = 300
MIN_STEP_S = 20


def run(device: str, out: Path, prepared: Path, budget_s: float, only: list[str] | None,
        peak_tflops: float | None) -> int:  # fmt: skip
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    log_path = out / "gpu-check.log"
    env, installed = step_environment(prepared, work)
    body: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "prepared_at": prepared_commit(prepared),
        "device": device,
        "machine": machine(device, env),
        "install": installed,
        "budget_s": budget_s,
        "steps": {},
    }
    json_path = out / "gpu-check.json"
    json_path.write_text(json.dumps(body, indent=1) + "\n")
    print(report.header(body), flush=True)
    for step in PLAN:
        if only and step.name not in only:
            continue
        left = budget_s - (time.monotonic() - started)
        limit = min(step.limit_s if device == "cuda" else CPU_LIMIT_S, left)
        if limit < MIN_STEP_S:
            body["steps"][step.name] = {"status": "skipped", "why": f"{left:.0f} s left"}
        else:
            body["steps"][step.name] = run_step(step, device, work, prepared, env, limit,
                                                log_path, peak_tflops)  # fmt: skip
        print(report.row(step.name, step.what, body["steps"][step.name]), flush=True)
        json_path.write_text(json.dumps(body, indent=1) + "\n")
    body["seconds"] = time.monotonic() - started
    json_path.write_text(json.dumps(body, indent=1) + "\n")
    print(report.footer(body, json_path), flush=True)
    return 0 if all(s["status"] == "passed" for s in body["steps"].values()) else 1


def step_environment(prepared: Path, work: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """The environment of the steps' processes: the wheels' folder first on the path when
    they were built for this interpreter, then the checkout and its scripts."""
    root = Path(__file__).resolve().parents[2]
    installed = install.install(prepared / "wheels", work / "site", prepared)
    paths = [str(root / "scripts"), str(root)]
    if installed["usable"]:
        paths.insert(0, installed["target"])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(":"),
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
    }  # fmt: skip
    return env, installed


def run_step(
    step: Step,
    device: str,
    work: Path,
    prepared: Path,
    env: dict[str, str],
    limit: float,
    log_path: Path,
    peak_tflops: float | None,
) -> dict[str, Any]:
    result_path = work / f"{step.name}.json"
    argv = [sys.executable, "-m", "gpu_check.step", step.name, "--device", device,
            "--work", str(work), "--tokenizer", str(prepared / "tokenizer"),
            "--result", str(result_path)]  # fmt: skip
    if peak_tflops:
        argv += ["--peak-tflops", str(peak_tflops)]
    root = Path(__file__).resolve().parents[2]
    started = time.monotonic()
    with open(log_path, "a") as log:
        log.write(f"\n===== {step.name} (limit {limit:.0f} s) =====\n")
        log.flush()
        process = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        try:
            code: int | None = process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            code = None
            stop_group(process)
    seconds = time.monotonic() - started
    found = json.loads(result_path.read_text()) if result_path.exists() else {}
    checks = found.get("checks", [])
    if code is None:
        status, why = "timed out", f"after {limit:.0f} s"
    elif code != 0:
        status, why = "crashed", last_error(log_path)
    elif not checks or not all(c["ok"] for c in checks):
        status, why = "failed", "; ".join(c["name"] for c in checks if not c["ok"]) or "no check"
    else:
        status, why = "passed", ""
    return {"status": status, "why": why, "seconds": round(seconds, 1), **found}


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """The step and every server it started (its own process group)."""
    import signal

    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def last_error(log_path: Path) -> str:
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["no output"])[-1].strip()[:300]


def commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        found = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                               text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True,
                           text=True, timeout=10).stdout.strip()  # fmt: skip
    return found.stdout.strip() + ("+changes" if dirty else "") if found.returncode == 0 else None


def prepared_commit(prepared: Path) -> str | None:
    """The commit ``prepare`` ran at: a copy of the tree may carry no .git, or an old one."""
    return json.loads((prepared / "manifest.json").read_text()).get("commit") or None


def machine(device: str, env: dict[str, str]) -> dict[str, Any]:
    """Device name, memory and the versions that matter, read in a process with the steps'
    environment (the installed wheels first)."""
    probe = (
        "import json, platform, torch, transformers, pydantic, fastapi\n"
        "cuda = torch.cuda.is_available()\n"
        "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__,\n"
        " 'cuda': torch.version.cuda, 'transformers': transformers.__version__,\n"
        " 'pydantic': pydantic.__version__, 'fastapi': fastapi.__version__,\n"
        " 'gpu': torch.cuda.get_device_name() if cuda else None,\n"
        " 'gpu_memory_gib': torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda\n"
        "   else None}))\n"
    )
    found = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    facts: dict[str, Any] = {"host": platform.node(), "cpus": os.cpu_count()}
    if found.returncode == 0:
        facts.update(json.loads(found.stdout.strip().splitlines()[-1]))
    else:
        facts["probe_error"] = found.stderr.strip().splitlines()[-1:] or ["no output"]
    if device == "cuda" and not facts.get("gpu"):
        facts["warning"] = "--device cuda but torch sees no GPU"
    return facts
