"""A small request's latency while one huge request runs on the embedded inference server.

The huge request: ``--prompts`` prompts x ``n`` = ``--n`` on ``/v1/completions``, each
choice ``--big-tokens`` sampled tokens (100 x 32 x 4 by default: 3,200 sequences, 12,800
tokens). While it runs, small requests (one prompt, 2 greedy tokens) are sent one after
another; their latencies are compared with the same small request on an idle server and
expressed in decode steps (the huge request's time per full-batch step, measured in the
same run). Issue 16's target: the small request waits a few decode steps, not for the
huge request to finish.

    python benchmarks/inference_fairness.py                             # this checkout
    python benchmarks/inference_fairness.py --baseline-tree /tmp/before # and another one

``--baseline-tree`` (and ``--tree``, default: this checkout): a checkout whose ``atroposlib``
is served, e.g. ``git archive <commit> atroposlib | tar -x -C /tmp/before``; the baseline
is measured first, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from inference_throughput import start_embedded  # noqa: E402

MAX_BATCH = 16


@dataclass
class Fairness:
    idle_s: float
    loaded_s: list[float]
    big_s: float
    step_s: float

    def report(self, label: str) -> str:
        p50, worst = statistics.median(self.loaded_s), max(self.loaded_s)
        return (
            f"{label:9} small request idle {self.idle_s * 1000:7.0f} ms | while the huge one "
            f"runs: p50 {p50:7.2f} s, max {worst:7.2f} s ({len(self.loaded_s)} requests) "
            f"= {p50 / self.step_s:6.1f} / {worst / self.step_s:6.1f} decode steps | huge "
            f"request {self.big_s:6.1f} s ({self.step_s * 1000:.0f} ms per step)"
        )


async def small_request(http: httpx.AsyncClient, model: str) -> float:
    body = {"model": model, "prompt": "Hi", "max_tokens": 2, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    response = await http.post("/v1/completions", json=body)
    response.raise_for_status()
    assert response.json()["usage"]["completion_tokens"] == 2
    return time.perf_counter() - start


async def measure(url: str, model: str, prompts: int, n: int, big_tokens: int) -> Fairness:
    async with httpx.AsyncClient(base_url=url, timeout=3600) as http:
        idle = statistics.median([await small_request(http, model) for _ in range(5)])
        big_body = {
            "model": model,
            "prompt": [f"Story number {i}: once upon a time" for i in range(prompts)],
            "n": n,
            "max_tokens": big_tokens,
            "temperature": 1.0,
            "ignore_eos": True,
        }
        start = time.perf_counter()
        big = asyncio.create_task(http.post("/v1/completions", json=big_body))
        await asyncio.sleep(1.0)  # the huge request is queued and running
        loaded = []
        while not big.done():
            loaded.append(await small_request(http, model))
            await asyncio.sleep(0.2)
        response = await big
        big_s = time.perf_counter() - start
    response.raise_for_status()
    assert len(response.json()["choices"]) == prompts * n
    steps = prompts * n * big_tokens / MAX_BATCH  # full batches, one token per row per step
    return Fairness(idle_s=idle, loaded_s=loaded, big_s=big_s, step_s=big_s / steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the test model")
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--big-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the server")
    parser.add_argument("--baseline-tree", type=Path, default=None)
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to measure")
    args = parser.parse_args()

    from atroposlib.utils.test_model import ensure_test_model

    model_path = args.model or ensure_test_model()
    trees = {"embedded": args.tree.resolve()}
    if args.baseline_tree:
        trees = {"baseline": args.baseline_tree.resolve(), **trees}
    results = {}
    for label, source in trees.items():
        process, url = start_embedded(model_path, args.threads, MAX_BATCH, source=source)
        try:
            results[label] = asyncio.run(
                measure(url, str(model_path), args.prompts, args.n, args.big_tokens)
            )
        finally:
            process.terminate()
            process.wait(timeout=30)
        print(results[label].report(label), flush=True)
    if "baseline" in results:
        before, after = results["baseline"], results["embedded"]
        ratio = statistics.median(before.loaded_s) / statistics.median(after.loaded_s)
        print(f"\nsmall-request p50 latency under load, baseline / embedded: {ratio:.1f}x")
        print(f"huge request time, embedded / baseline: {after.big_s / before.big_s:.2f}x")


if __name__ == "__main__":
    main()
