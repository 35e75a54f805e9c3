"""Env framework overhead: groups/s and CPU seconds per group, side by side in one run.

``--compare atropos`` (default): ours vs atroposlib 0.4.0, both running
``benchmarks/trivial_env.py`` (one source, trivial scoring, fixed tokens).
``--compare paths``: the token path (``sample_group`` on ``/generate``: the group is the ids
the server sampled) vs the old text path (chat completion, then every chat re-tokenized with
the chat template), both ``benchmarks/sampling_env.py`` on our framework, replies of
``--reply-words`` tokens.

Each runs against the same instant fake inference server (``tests/envs/fake_openai.py``) and a
real broker (``python -m atroposlib.api --store memory``); a trainer loop here pulls batches as
fast as they form. The measured window skips the first batches (start-up, tokenizer load) and
counts the env process's CPU time (user + system) and wall time over the next ones.

    python benchmarks/env_overhead.py [--compare paths] [--batches 30] [--warmup 5]

For ``atropos``, atroposlib 0.4.0 must be installed in ``benchmarks/.venv-atropos-env``:
    python3.11 -m venv benchmarks/.venv-atropos-env
    benchmarks/.venv-atropos-env/bin/pip install atroposlib==0.4.0
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from atroposlib.utils.health import wait_healthy

ROOT = Path(__file__).resolve().parents[1]
ATROPOS_PYTHON = ROOT / "benchmarks/.venv-atropos-env/bin/python"
BATCH_SIZE = 64


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tokenizer_folder() -> str:
    try:
        sys.path.insert(0, str(ROOT))
        from atroposlib.utils.test_model import ensure_test_model

        return str(ensure_test_model())
    except ImportError:
        return str(Path.home() / ".cache/atroposlib/models/SmolLM2-135M-Instruct")


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def run_one(
    label: str,
    python: str,
    pythonpath: str | None,
    batches: int,
    warmup: int,
    *,
    script: str = "trivial_env.py",
    extra_env: dict[str, str] | None = None,
    reply_words: int = 0,
) -> dict[str, float]:
    logs = ROOT / "benchmarks" / "logs"
    logs.mkdir(exist_ok=True)
    infer_port, broker_port = free_port(), free_port()
    base_env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    ours = {**base_env, "PYTHONPATH": str(ROOT)}
    children = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "tests/envs/fake_openai.py"), "--port", str(infer_port),
             "--reply-words", str(reply_words)],
            env=ours, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [sys.executable, "-m", "atroposlib.api", "--port", str(broker_port),
             "--store", "memory", "--log-level", "warning"],
            env=ours, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    broker = f"http://127.0.0.1:{broker_port}"
    try:
        wait_healthy(f"http://127.0.0.1:{infer_port}/health", timeout_s=30, poll_s=0.1,
                     process=children[0], name="the fake inference server")  # fmt: skip
        wait_healthy(f"{broker}/health", timeout_s=30, poll_s=0.1, process=children[1],
                     name="the broker")  # fmt: skip
        trainer = {"wandb_group": "bench", "wandb_project": "bench", "batch_size": BATCH_SIZE,
                   "max_token_len": 512, "checkpoint_dir": "", "save_checkpoint_interval": 0,
                   "starting_step": 0, "num_steps": 100000}  # fmt: skip
        httpx.post(broker + "/register", json=trainer).raise_for_status()
        httpx.get(broker + "/batch")
        env_vars = {
            **base_env,
            "BENCH_BROKER": broker,
            "BENCH_INFERENCE": f"http://127.0.0.1:{infer_port}/v1",
            "BENCH_TOKENIZER": tokenizer_folder(),
            **(extra_env or {}),
        }
        if pythonpath:
            env_vars["PYTHONPATH"] = pythonpath
        else:
            env_vars.pop("PYTHONPATH", None)
        with (logs / f"{label}.log").open("wb") as log:
            env = subprocess.Popen(
                [python, str(ROOT / "benchmarks" / script), "serve"],
                env=env_vars, stdout=log, stderr=subprocess.STDOUT, cwd=logs,
            )  # fmt: skip
        children.append(env)
        process = psutil.Process(env.pid)
        pulled, groups = 0, 0
        started_wall = started_cpu = 0.0
        with httpx.Client(base_url=broker, timeout=30) as client:
            while pulled < warmup + batches:
                if env.poll() is not None:
                    raise RuntimeError(f"{label} env exited; see benchmarks/logs/{label}.log")
                batch = client.get("/batch").json()["batch"]
                if not batch:
                    time.sleep(0.01)
                    continue
                pulled += 1
                if pulled == warmup:
                    started_wall, started_cpu = time.perf_counter(), cpu_seconds(process)
                elif pulled > warmup:
                    groups += len(batch)
        wall = time.perf_counter() - started_wall
        cpu = cpu_seconds(process) - started_cpu
        return {"groups": groups, "wall_s": wall, "cpu_s": cpu}
    finally:
        for child in reversed(children):
            child.kill()
            child.wait()


def print_table(results: dict[str, dict[str, float]], baseline: str, ours: str) -> None:
    print(f"{'':24} {'groups':>7} {'groups/s':>9} {'CPU s/group':>12} {'groups/CPU s':>13}")
    for label, r in results.items():
        print(
            f"{label:24} {r['groups']:7d} {r['groups'] / r['wall_s']:9.1f} "
            f"{r['cpu_s'] / r['groups']:12.5f} {r['groups'] / r['cpu_s']:13.1f}"
        )
    base, mine = results[baseline], results[ours]
    speed = (mine["groups"] / mine["wall_s"]) / (base["groups"] / base["wall_s"])
    efficiency = (mine["groups"] / mine["cpu_s"]) / (base["groups"] / base["cpu_s"])
    print(
        f"ratio {ours}/{baseline}: groups/s x{speed:.2f}, groups per CPU second x{efficiency:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compare", choices=["atropos", "paths"], default="atropos")
    parser.add_argument("--batches", type=int, default=30, help="measured batches (64 seqs)")
    parser.add_argument("--warmup", type=int, default=5, help="batches skipped first")
    parser.add_argument("--reply-words", type=int, default=64, help="reply length (paths)")
    args = parser.parse_args()
    if args.compare == "paths":
        results = {
            f"{path} path": run_one(
                f"{path}-path", sys.executable, str(ROOT), args.batches, args.warmup,
                script="sampling_env.py", extra_env={"BENCH_PATH": path},
                reply_words=args.reply_words,
            )
            for path in ("text", "token")
        }  # fmt: skip
        print_table(results, "text path", "token path")
        return
    if not ATROPOS_PYTHON.exists():
        raise SystemExit(f"missing {ATROPOS_PYTHON}: see this file's docstring")
    results = {
        "atroposlib 0.4.0": run_one(
            "atropos-0.4.0", str(ATROPOS_PYTHON), None, args.batches, args.warmup
        ),
        "ours": run_one("ours", sys.executable, str(ROOT), args.batches, args.warmup),
    }
    print_table(results, "atroposlib 0.4.0", "ours")


if __name__ == "__main__":
    main()
