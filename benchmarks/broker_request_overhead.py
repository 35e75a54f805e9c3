"""Fixed CPU cost of one request in the ASGI app alone (no sockets, no uvicorn): ours vs Atropos.

The app is called directly with an ASGI scope, so what is timed is routing, middleware,
dependency solving, body reading, the handler and response building: the cost that a POST of
a small group pays regardless of its size. ``--profile`` prints cProfile's top functions for
ours (CPU timer).

    python benchmarks/broker_request_overhead.py
    python benchmarks/broker_request_overhead.py --ours-src ../broker --profile

Atropos's app runs in the venv that ``broker_throughput.py`` creates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REQUESTS = 3000


async def _call(app: Any, method: str, path: str, body: bytes = b"") -> int:
    headers = [
        (b"host", b"127.0.0.1:8000"),  # a name the broker answers to (not a rebinding)
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"accept-encoding", b"gzip, deflate"),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    status = 0

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


_LIFESPANS: list[asyncio.Task[Any]] = []  # held, or the task is collected and the app stops


async def _start(app: Any) -> None:
    """Run the app's lifespan startup (ours opens its store there)."""
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await messages.put({"type": "lifespan.startup"})
    started = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"].startswith("lifespan.startup"):
            started.set()

    lifespan = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    _LIFESPANS.append(asyncio.get_running_loop().create_task(app(lifespan, messages.get, send)))
    await started.wait()


async def _measure(app: Any, lifespan: bool) -> dict[str, float]:
    if lifespan:
        await _start(app)
    registration = {
        "wandb_group": "g",
        "wandb_project": "p",
        "batch_size": 64,
        "max_token_len": 64,
        "checkpoint_dir": "",
        "save_checkpoint_interval": 0,
        "starting_step": 0,
        "num_steps": 10,
    }
    await _call(app, "POST", "/register", json.dumps(registration).encode())
    await _call(app, "GET", "/batch")
    env = {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 1}
    await _call(app, "POST", "/register-env", json.dumps(env).encode())
    bodies = [
        json.dumps(
            {
                "tokens": [[i, 1, 2, 3]],
                "masks": [[-100, 1, 2, 3]],
                "scores": [0.5],
                "env_id": 0,
                "group_id": f"t{i}",
            }
        ).encode()
        for i in range(REQUESTS)
    ]
    out: dict[str, float] = {}
    start = time.process_time()
    for _ in range(REQUESTS):
        assert await _call(app, "GET", "/status") == 200
    out["GET /status"] = (time.process_time() - start) / REQUESTS * 1e6
    start = time.process_time()
    for body in bodies:
        assert await _call(app, "POST", "/scored_data", body) == 200
    out["POST /scored_data (1x4 tokens)"] = (time.process_time() - start) / REQUESTS * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ours-src", type=Path, default=ROOT, help="source tree of our broker")
    parser.add_argument("--profile", action="store_true", help="cProfile ours (CPU timer)")
    parser.add_argument("--atropos-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.atropos_side:
        from atroposlib.api.server import app as atropos_app

        print(json.dumps(asyncio.run(_measure(atropos_app, lifespan=False))))
        return 0
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from broker_throughput import ensure_atropos_venv  # puts ROOT on sys.path

    sys.path.insert(0, str(args.ours_src.resolve()))  # so that --ours-src comes first

    from atroposlib.api.app import create_app
    from atroposlib.api.settings import BrokerSettings

    answer = subprocess.run(
        [str(ensure_atropos_venv()), str(Path(__file__).resolve()), "--atropos-side"],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
    )
    theirs = json.loads(answer.stdout.strip().splitlines()[-1])
    results = {}
    for store in ("memory", "sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            spec = "memory" if store == "memory" else f"sqlite:{tmp}/b.sqlite3"
            app = create_app(BrokerSettings(store=spec))
            if args.profile and store == "memory":
                import cProfile
                import pstats

                profiler = cProfile.Profile(time.process_time)
                profiler.enable()
                results[store] = asyncio.run(_measure(app, lifespan=True))
                profiler.disable()
                pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            else:
                results[store] = asyncio.run(_measure(app, lifespan=True))
    print(f"CPU µs per request, ASGI app only ({REQUESTS} requests each)")
    print(f"{'request':<34} {'Atropos':>9} {'ours mem':>9} {'ours sqlite':>12}")
    for name, value in theirs.items():
        print(
            f"{name:<34} {value:>9.1f} {results['memory'][name]:>9.1f} "
            f"{results['sqlite'][name]:>12.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
