"""Broker memory per queued token: a real ``run-api`` process with the SQLite store.

Posts N groups (msgpack, G sequences of L tokens) to a broker whose trainer batch is too large
to form, then reads the broker's RSS growth with psutil. The baseline is the same groups held as
Python lists (what a list-based in-memory queue such as Atropos 0.4's keeps), measured with
tracemalloc in this process. Target: <= 10 bytes of broker RSS per queued token.

    python benchmarks/broker_memory.py --groups 2000 --group-size 8 --length 512
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import httpx
import msgpack
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from atroposlib.codec import pack_group  # noqa: E402
from atroposlib.utils.health import wait_healthy  # noqa: E402


def make_group(rng: random.Random, size: int, length: int) -> dict[str, object]:
    tokens = [[rng.randrange(150_000) for _ in range(length)] for _ in range(size)]
    prompt = length // 4
    masks = [[-100] * prompt + row[prompt:] for row in tokens]
    logprobs = [[1.0] * prompt + [-rng.random() for _ in range(length - prompt)] for _ in tokens]
    return {
        "tokens": tokens,
        "masks": masks,
        "scores": [1.0] * size,
        "inference_logprobs": logprobs,
    }


def python_list_bytes(groups: list[dict[str, object]]) -> int:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = [
        {k: [list(row) for row in v] if isinstance(v, list) and v and isinstance(v[0], list) else v
         for k, v in g.items()}
        for g in groups
    ]  # fmt: skip
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del held
    return after - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    args = parser.parse_args()
    rng = random.Random(0)
    sample = [make_group(rng, args.group_size, args.length) for _ in range(20)]
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        command = [sys.executable, "-m", "atroposlib.api", "--port", str(port),
                   "--store", f"sqlite:{tmp}/bench.sqlite3", "--log-level", "warning"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(command, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(f"{url}/health", timeout_s=30, poll_s=0.1, process=proc, name="the broker")
            with httpx.Client(base_url=url, timeout=60) as http:
                registration = {"wandb_group": "g", "wandb_project": "p", "batch_size": 10**9,
                                "max_token_len": args.length, "checkpoint_dir": "c",
                                "save_checkpoint_interval": 1, "starting_step": 0,
                                "num_steps": 1}  # fmt: skip
                http.post("/register", json=registration).raise_for_status()
                headers = {"content-type": "application/msgpack"}
                bodies = [msgpack.packb([pack_group(g)], use_bin_type=True) for g in sample]
                http.post("/scored_data_list", content=bodies[0], headers=headers)
                base = psutil.Process(proc.pid).memory_info().rss
                started = time.perf_counter()
                for i in range(args.groups - 1):
                    http.post("/scored_data_list", content=bodies[i % len(bodies)],
                              headers=headers).raise_for_status()  # fmt: skip
                elapsed = time.perf_counter() - started
                rss = psutil.Process(proc.pid).memory_info().rss
                queued = http.get("/status").json()["queue_size"]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    tokens = (args.groups - 1) * args.group_size * args.length
    per_token = (rss - base) / tokens
    baseline = python_list_bytes(sample) / (len(sample) * args.group_size * args.length)
    print(f"queued groups: {queued}, tokens added: {tokens:,}, ingest {elapsed:.1f} s "
          f"({tokens / elapsed / 1e6:.2f} M tokens/s, one client)")  # fmt: skip
    print(f"broker RSS growth: {(rss - base) / 2**20:.1f} MiB = {per_token:.2f} bytes/token "
          f"(target <= 10)")  # fmt: skip
    print(f"baseline, same groups as Python lists: {baseline:.1f} bytes/token; "
          f"ratio baseline/broker: {baseline / max(per_token, 1e-9):.0f}x")  # fmt: skip


if __name__ == "__main__":
    main()
