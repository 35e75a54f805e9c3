"""Broker throughput: our broker against Atropos 0.4.0's API server, same load, same machine.

Both servers run on loopback, each in a fresh process per row. The load is hand-written (a
minimal HTTP/1.1 keep-alive client in this file; bodies as JSON via orjson, or as msgpack with
packed arrays through ``atroposlib.codec`` for the fast encoding) so that neither server gets a
client tuned for it, and the client stays cheap enough not to share the bottleneck:

- the trainer registers (``POST /register``), calls ``GET /batch`` once (Atropos refuses
  ``/register-env`` until then), and E environments register;
- one process runs E asyncio env workers, each posting its groups (``POST /scored_data``, one
  outstanding request per env) as fast as the server answers; G sequences of L tokens, masks
  -100 on a prompt prefix (a quarter of L), the token id elsewhere, float scores; the first
  token of every sequence is its global sequence id;
- one trainer process pulls ``GET /batch`` as fast as it can (sleeping ``POLL_SECONDS`` after an
  empty answer) and counts every sequence id, so lost and duplicated sequences are exact.

Both clients send ``Accept-Encoding: gzip, deflate`` (as requests and aiohttp do), so a server
that compresses large answers does so, as it would for a real trainer. Request bodies are sent
uncompressed.

Measured per row: tokens/s delivered to the trainer (wall clock from the first post to the
last batch), p50/p99 latency of POST /scored_data and of GET /batch answers that carried a
batch, server CPU seconds (user+system, incl. children) per 1k sequences, server peak RSS,
client CPU per 1k sequences, lost/duplicated/corrupt sequence counts. The backlog run posts
groups with no trainer pulling and reports the server's RSS growth per queued token.

    python benchmarks/broker_throughput.py            # full run (~5 min)
    python benchmarks/broker_throughput.py --quick    # smoke run (~1 min)
    python benchmarks/broker_throughput.py --only ours-sqlite,ours-memory --json out.json

The Atropos virtual environment is created on first use under ``benchmarks/.venv-atropos``:
``atroposlib==0.4.0`` without its dependencies, plus only what ``atroposlib.api.server``
imports (fastapi, uvicorn[standard], pydantic), pinned to the versions our own server runs on.
It is started the way Atropos's ``run-api`` starts it: uvicorn's defaults (uvloop, httptools,
info log level with access log) on ``atroposlib.api:app``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import multiprocessing as mp
import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import httpx
import msgpack
import numpy as np
import orjson
import psutil

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from atroposlib.utils.health import wait_healthy  # noqa: E402

ATROPOS_VERSION = "0.4.0"
ATROPOS_VENV = ROOT / "benchmarks" / ".venv-atropos"
# What atroposlib.api.server imports, pinned to the versions of the venv running this script.
ATROPOS_SERVER_DEPS = ("fastapi", "uvicorn[standard]", "pydantic")
MSGPACK = "application/msgpack"
POLL_SECONDS = 0.005
PROMPT_FRACTION = 0.25
VOCAB = 50_000
SERVERS = ("atropos", "ours-sqlite", "ours-memory")


@dataclasses.dataclass(frozen=True)
class Shape:
    envs: int
    group_size: int
    seq_len: int
    batch_size: int
    groups_per_env: int

    @property
    def label(self) -> str:
        return f"E={self.envs} G={self.group_size} L={self.seq_len} B={self.batch_size}"

    @property
    def total_sequences(self) -> int:
        return self.envs * self.groups_per_env * self.group_size


@dataclasses.dataclass
class LoadResult:
    """What one closed-loop run measured on the client side."""

    sequences_expected: int
    sequences_delivered: int
    tokens_delivered: int
    lost: int
    duplicated: int
    corrupt: int
    post_errors: int
    wall_seconds: float
    post_latencies_ms: list[float]
    get_latencies_ms: list[float]
    empty_polls: int
    env_cpu_seconds: float
    trainer_cpu_seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_delivered / self.wall_seconds if self.wall_seconds > 0 else 0.0


# ---------------------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------------------


def make_group(shape: Shape, first_id: int, env_id: int, rng: np.random.Generator) -> dict:
    """One group whose sequence k starts with the token ``first_id + k``."""
    tokens = rng.integers(0, VOCAB, size=(shape.group_size, shape.seq_len), dtype=np.int32)
    tokens[:, 0] = np.arange(first_id, first_id + shape.group_size, dtype=np.int32)
    masks = tokens.copy()
    masks[:, : int(shape.seq_len * PROMPT_FRACTION)] = -100
    return {
        "tokens": list(tokens),
        "masks": list(masks),
        "scores": rng.uniform(-1.0, 1.0, size=shape.group_size).tolist(),
        "env_id": env_id,
        "group_id": f"bench-{first_id}",
    }


def encode_group(group: dict, encoding: str) -> bytes:
    if encoding == "msgpack":
        from atroposlib.codec import pack_group

        return msgpack.packb(pack_group(group), use_bin_type=True)
    return orjson.dumps(group, option=orjson.OPT_SERIALIZE_NUMPY)


def sequence_ids(groups: list[dict], encoding: str) -> tuple[list[int], int]:
    """First token and total token count of every sequence of a batch."""
    ids: list[int] = []
    tokens = 0
    for group in groups:
        for row in group["tokens"]:
            if encoding == "msgpack" and isinstance(row, bytes | bytearray):
                ids.append(int(np.frombuffer(row, dtype="<i4", count=1)[0]))
                tokens += len(row) // 4
            else:
                ids.append(row[0])
                tokens += len(row)
    return ids, tokens


# ---------------------------------------------------------------------------------------
# Client processes
# ---------------------------------------------------------------------------------------


ACCEPT_ENCODING = "gzip, deflate"


def _headers(encoding: str) -> dict[str, str]:
    if encoding == "msgpack":
        return {"Content-Type": MSGPACK, "Accept": MSGPACK}
    return {"Content-Type": "application/json"}


# A minimal HTTP/1.1 keep-alive client: httpx costs about as much CPU per request as the
# broker under test, and on two cores the client would share the bottleneck. Both servers get
# exactly the same requests from it.


@dataclasses.dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def _request_head(method: str, path: str, host: str, headers: dict[str, str], size: int) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Accept-Encoding: {ACCEPT_ENCODING}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {size}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(status_line.split(" ", 2)[1]), headers


def _inflate(headers: dict[str, str], body: bytes) -> bytes:
    coding = headers.get("content-encoding", "identity")
    if coding == "gzip":
        return zlib.decompress(body, 16 + zlib.MAX_WBITS)
    if coding == "deflate":
        return zlib.decompress(body)
    return body


class AsyncHttp:
    def __init__(self, base_url: str) -> None:
        self.host, _, port = base_url.removeprefix("http://").partition(":")
        self.port = int(port)
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> RawResponse:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port, limit=2**20)
        reader, writer = self._streams
        head = _request_head(method, path, f"{self.host}:{self.port}", headers or {}, len(body))
        writer.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            writer.write(body)
        await writer.drain()
        status, response_headers = _parse_head((await reader.readuntil(b"\r\n\r\n"))[:-4])
        if response_headers.get("transfer-encoding") == "chunked":
            chunks = []
            while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
                chunks.append(await reader.readexactly(size + 2))
            await reader.readuntil(b"\r\n")
            raw = b"".join(chunk[:-2] for chunk in chunks)
        else:
            raw = await reader.readexactly(int(response_headers.get("content-length", "0")))
        if response_headers.get("connection") == "close":
            writer.close()
            self._streams = None
        return RawResponse(status, response_headers, _inflate(response_headers, raw))

    async def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


class SyncHttp:
    def __init__(self, base_url: str) -> None:
        self.host, _, port = base_url.removeprefix("http://").partition(":")
        self.port = int(port)
        self._sock: socket.socket | None = None
        self._file: Any = None

    def request(self, method: str, path: str, headers: dict[str, str] | None = None) -> RawResponse:
        if self._sock is None:
            self._sock = socket.create_connection((self.host, self.port))
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._file = self._sock.makefile("rb", buffering=2**20)
        self._sock.sendall(
            _request_head(method, path, f"{self.host}:{self.port}", headers or {}, 0)
        )
        lines = []
        while (line := self._file.readline()) not in (b"\r\n", b""):
            lines.append(line.rstrip(b"\r\n"))
        status, response_headers = _parse_head(b"\r\n".join(lines))
        if response_headers.get("transfer-encoding") == "chunked":
            chunks = []
            while size := int(self._file.readline().strip(), 16):
                chunks.append(self._file.read(size + 2)[:-2])
            self._file.readline()
            raw = b"".join(chunks)
        else:
            raw = self._file.read(int(response_headers.get("content-length", "0")))
        return RawResponse(status, response_headers, _inflate(response_headers, raw))

    def close(self) -> None:
        if self._sock is not None:
            self._file.close()
            self._sock.close()
            self._sock = None


async def _post_all(
    base_url: str, bodies: list[bytes], encoding: str, latencies: list[float]
) -> int:
    errors = 0
    headers = _headers(encoding)
    client = AsyncHttp(base_url)
    try:
        for body in bodies:
            while True:
                start = time.perf_counter()
                response = await client.request("POST", "/scored_data", body, headers)
                latencies.append((time.perf_counter() - start) * 1000.0)
                if response.status == 503:
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")))
                    continue
                if response.status != 200:
                    errors += 1
                break
    finally:
        await client.close()
    return errors


def env_process(
    base_url: str,
    shape: Shape,
    env_ids: list[int],
    encoding: str,
    ready: Any,
    start: Any,
    results: Any,
) -> None:
    """E env workers as asyncio tasks; bodies are encoded before the clock starts."""
    rng = np.random.default_rng(1234)
    per_env: list[list[bytes]] = []
    for index, env_id in enumerate(env_ids):
        bodies = []
        for k in range(shape.groups_per_env):
            first_id = (index * shape.groups_per_env + k) * shape.group_size
            bodies.append(encode_group(make_group(shape, first_id, env_id, rng), encoding))
        per_env.append(bodies)
    ready.set()
    start.wait()
    cpu0 = time.process_time()
    latencies: list[list[float]] = [[] for _ in env_ids]

    async def run_all() -> list[int]:
        return await asyncio.gather(
            *(
                _post_all(base_url, bodies, encoding, lat)
                for bodies, lat in zip(per_env, latencies, strict=True)
            )
        )

    errors = asyncio.run(run_all())
    results.put(
        (
            "env",
            {
                "post_errors": sum(errors),
                "post_latencies_ms": [x for lat in latencies for x in lat],
                "cpu_seconds": time.process_time() - cpu0,
            },
        )
    )


def trainer_process(
    base_url: str,
    shape: Shape,
    encoding: str,
    ready: Any,
    start: Any,
    envs_done: Any,
    drain_seconds: float,
    results: Any,
) -> None:
    """Pull batches as fast as the server hands them out; count every sequence id."""
    seen = np.zeros(shape.total_sequences, dtype=np.int64)
    corrupt = 0
    tokens = 0
    latencies: list[float] = []
    empty = 0
    last_batch_at = time.monotonic()
    headers = {"Accept": MSGPACK} if encoding == "msgpack" else {}
    if encoding == "msgpack":
        from atroposlib.codec import decode  # imported before the clock starts
    client = SyncHttp(base_url)
    try:
        ready.set()
        start.wait()
        t0 = time.monotonic()
        cpu0 = time.process_time()
        idle_since: float | None = None
        while int((seen > 0).sum()) < shape.total_sequences:
            begin = time.perf_counter()
            response = client.request("GET", "/batch", headers)
            elapsed = (time.perf_counter() - begin) * 1000.0
            if response.status != 200:
                raise RuntimeError(
                    f"GET /batch answered {response.status}: {response.body[:300]!r}"
                )
            if encoding == "msgpack" and MSGPACK in response.headers.get("content-type", ""):
                body = decode(response.body, MSGPACK)
            else:
                body = orjson.loads(response.body)
            batch = body.get("batch")
            if not batch:
                empty += 1
                if envs_done.is_set():
                    idle_since = idle_since or time.monotonic()
                    if time.monotonic() - idle_since > drain_seconds:
                        break
                time.sleep(POLL_SECONDS)
                continue
            idle_since = None
            latencies.append(elapsed)
            last_batch_at = time.monotonic()
            ids, batch_tokens = sequence_ids(batch, encoding)
            tokens += batch_tokens
            for seq_id in ids:
                if 0 <= seq_id < shape.total_sequences:
                    seen[seq_id] += 1
                else:
                    corrupt += 1
        cpu = time.process_time() - cpu0
    finally:
        client.close()
    results.put(
        (
            "trainer",
            {
                "delivered": int(seen.sum()),
                "lost": int((seen == 0).sum()),
                "duplicated": int(np.clip(seen - 1, 0, None).sum()),
                "corrupt": corrupt,
                "tokens": tokens,
                "wall_seconds": last_batch_at - t0,
                "get_latencies_ms": latencies,
                "empty_polls": empty,
                "cpu_seconds": cpu,
            },
        )
    )


# ---------------------------------------------------------------------------------------
# Protocol of a run
# ---------------------------------------------------------------------------------------


def register(base_url: str, shape: Shape) -> list[int]:
    """Trainer registration, the first GET /batch, then E env registrations; returns env ids."""
    with httpx.Client(base_url=base_url, timeout=30.0) as client:
        client.post(
            "/register",
            json={
                "wandb_group": "bench",
                "wandb_project": "bench",
                "batch_size": shape.batch_size,
                "max_token_len": shape.seq_len,
                "checkpoint_dir": "",
                "save_checkpoint_interval": 0,
                "starting_step": 0,
                "num_steps": 1_000_000,
            },
        ).raise_for_status()
        client.get("/batch").raise_for_status()
        env_ids = []
        for _ in range(shape.envs):
            for _attempt in range(100):
                answer = client.post(
                    "/register-env",
                    json={
                        "max_token_length": shape.seq_len,
                        "desired_name": "bench",
                        "weight": 1.0,
                        "group_size": shape.group_size,
                    },
                )
                answer.raise_for_status()
                if answer.json().get("status") == "success":
                    env_ids.append(answer.json()["env_id"])
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"{base_url}: /register-env kept answering {answer.text}")
        return env_ids


def run_load(
    base_url: str, shape: Shape, encoding: str = "json", drain_seconds: float = 3.0
) -> LoadResult:
    """One closed-loop run against a running server (registration included)."""
    if shape.total_sequences % shape.batch_size:
        raise ValueError(f"{shape.label}: the total of sequences must be a multiple of B")
    env_ids = register(base_url, shape)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start, envs_done = ctx.Event(), ctx.Event()
    env_ready, trainer_ready = ctx.Event(), ctx.Event()
    envs = ctx.Process(
        target=env_process,
        args=(base_url, shape, env_ids, encoding, env_ready, start, results),
    )
    trainer = ctx.Process(
        target=trainer_process,
        args=(base_url, shape, encoding, trainer_ready, start, envs_done, drain_seconds, results),
    )
    envs.start()
    trainer.start()
    for event, proc in ((env_ready, envs), (trainer_ready, trainer)):
        while not event.wait(0.2):
            if not proc.is_alive():
                raise RuntimeError(f"client process {proc.name} died before starting")
    start.set()
    got: dict[str, dict] = {}
    while len(got) < 2:
        try:
            name, payload = results.get(timeout=1.0)
        except queue.Empty:
            if not envs.is_alive() and "env" not in got:
                raise RuntimeError("env process died") from None
            if not trainer.is_alive() and "trainer" not in got:
                raise RuntimeError("trainer process died") from None
            continue
        got[name] = payload
        if name == "env":
            envs_done.set()
    envs.join()
    trainer.join()
    env, tr = got["env"], got["trainer"]
    return LoadResult(
        sequences_expected=shape.total_sequences,
        sequences_delivered=tr["delivered"],
        tokens_delivered=tr["tokens"],
        lost=tr["lost"],
        duplicated=tr["duplicated"],
        corrupt=tr["corrupt"],
        post_errors=env["post_errors"],
        wall_seconds=tr["wall_seconds"],
        post_latencies_ms=env["post_latencies_ms"],
        get_latencies_ms=tr["get_latencies_ms"],
        empty_polls=tr["empty_polls"],
        env_cpu_seconds=env["cpu_seconds"],
        trainer_cpu_seconds=tr["cpu_seconds"],
    )


# ---------------------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ensure_atropos_venv(venv: Path = ATROPOS_VENV) -> Path:
    """Create (once) the venv holding Atropos's API server; returns its python."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import atroposlib.api.server, uvicorn"]
    if python.exists() and subprocess.run(probe, cwd=tempfile.gettempdir()).returncode == 0:
        return python
    print(f"creating {venv} (atroposlib=={ATROPOS_VERSION}, no deps, + server deps)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", f"atroposlib=={ATROPOS_VERSION}"], check=True)
    pinned = []
    for requirement in ATROPOS_SERVER_DEPS:
        name = requirement.split("[")[0]
        pinned.append(f"{requirement}=={importlib.metadata.version(name)}")
    subprocess.run([*pip, *pinned], check=True)
    subprocess.run(probe, cwd=tempfile.gettempdir(), check=True)
    return python


@dataclasses.dataclass
class Server:
    name: str
    popen: subprocess.Popen
    base_url: str
    log_path: Path

    @property
    def processes(self) -> list[psutil.Process]:
        root = psutil.Process(self.popen.pid)
        return [root, *root.children(recursive=True)]

    def cpu_seconds(self) -> float:
        total = 0.0
        for proc in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def rss(self) -> int:
        total = 0
        for proc in self.processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += proc.memory_info().rss
        return total

    def stop(self) -> None:
        self.popen.send_signal(signal.SIGINT)  # uvicorn shuts down cleanly; py-spy writes out
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def start_server(name: str, workdir: Path, ours_src: Path = ROOT) -> Server:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if name == "atropos":
        # The same app and uvicorn defaults as Atropos's run-api; cwd outside our repo so
        # that its atroposlib (not ours) is imported.
        python = ensure_atropos_venv()
        cmd = [str(python), "-m", "uvicorn", "atroposlib.api:app"]
        cmd += ["--host", "127.0.0.1", "--port", str(port)]
    else:
        store = "memory" if name == "ours-memory" else f"sqlite:{workdir / 'b.sqlite3'}"
        env["PYTHONPATH"] = str(ours_src)
        cmd = [sys.executable, "-m", "atroposlib.api", "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--store", store]
    # To profile one server, e.g.:
    # BROKER_BENCH_PREFIX_OURS_SQLITE="py-spy record -r 250 -f raw -o prof.txt --"
    prefix = os.environ.get(f"BROKER_BENCH_PREFIX_{name.upper().replace('-', '_')}", "")
    cmd = [*shlex.split(prefix), *cmd]
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = Server(name, popen, f"http://127.0.0.1:{port}", log_path)
    try:
        wait_healthy(f"{server.base_url}/", timeout_s=60, poll_s=0.1, process=popen,
                     log_path=log_path, name=name)  # fmt: skip
    except BaseException:
        server.stop()
        raise
    return server


class RssSampler(threading.Thread):
    """Peak resident memory of a server (incl. children), sampled every 20 ms."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.peak = server.rss()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.02):
            self.peak = max(self.peak, self.server.rss())

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, self.server.rss())


# ---------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def throughput_row(
    name: str, shape: Shape, encoding: str, workdir: Path, ours_src: Path = ROOT
) -> dict:
    server = start_server(name, workdir, ours_src)
    try:
        sampler = RssSampler(server)
        sampler.start()
        cpu0 = server.cpu_seconds()
        result = run_load(server.base_url, shape, encoding)
        cpu = server.cpu_seconds() - cpu0
        peak = sampler.stop()
    finally:
        server.stop()
    per_k = 1000.0 / max(result.sequences_delivered, 1)
    return {
        "shape": shape.label,
        "server": name,
        "encoding": encoding,
        "tokens_per_s": result.tokens_per_second,
        "wall_s": result.wall_seconds,
        "post_p50_ms": percentile(result.post_latencies_ms, 50),
        "post_p99_ms": percentile(result.post_latencies_ms, 99),
        "get_p50_ms": percentile(result.get_latencies_ms, 50),
        "get_p99_ms": percentile(result.get_latencies_ms, 99),
        "batches": len(result.get_latencies_ms),
        "empty_polls": result.empty_polls,
        "server_cpu_s_per_1k_seq": cpu * per_k,
        "server_rss_peak_mb": peak / 2**20,
        "client_cpu_s_per_1k_seq": (result.env_cpu_seconds + result.trainer_cpu_seconds) * per_k,
        "env_client_cpu_s": result.env_cpu_seconds,
        "trainer_client_cpu_s": result.trainer_cpu_seconds,
        "server_cpu_s": cpu,
        "sequences": result.sequences_expected,
        "delivered": result.sequences_delivered,
        "lost": result.lost,
        "duplicated": result.duplicated,
        "corrupt": result.corrupt,
        "post_errors": result.post_errors,
    }


def backlog_row(name: str, shape: Shape, workdir: Path, ours_src: Path = ROOT) -> dict:
    """Open loop: post every group with no trainer pulling; RSS growth per queued token."""
    server = start_server(name, workdir, ours_src)
    try:
        env_ids = register(server.base_url, shape)
        rng = np.random.default_rng(99)
        bodies = [
            encode_group(
                make_group(shape, k * shape.group_size, env_ids[k % len(env_ids)], rng), "json"
            )
            for k in range(shape.envs * shape.groups_per_env + 1)
        ]
        with httpx.Client(base_url=server.base_url, timeout=300.0) as client:
            headers = _headers("json")
            # One group first, so that lazy imports and first-request allocations are not
            # counted as queue memory.
            client.post("/scored_data", content=bodies[0], headers=headers).raise_for_status()
            time.sleep(0.5)
            base = server.rss()
            sampler = RssSampler(server)
            sampler.start()
            half = len(bodies) // 2
            for body in bodies[1:half]:
                client.post("/scored_data", content=body, headers=headers).raise_for_status()
            time.sleep(0.5)
            middle = server.rss()
            for body in bodies[half:]:
                client.post("/scored_data", content=body, headers=headers).raise_for_status()
            time.sleep(1.0)
            after = server.rss()
            peak = sampler.stop()
            status = client.get("/status").json()
    finally:
        server.stop()
    group_tokens = shape.group_size * shape.seq_len
    queued_tokens = shape.envs * shape.groups_per_env * group_tokens
    second_half_tokens = (len(bodies) - half) * group_tokens
    return {
        "shape": shape.label,
        "server": name,
        "queued_groups_reported": status.get("queue_size"),
        "queued_tokens": queued_tokens,
        "rss_base_mb": base / 2**20,
        "rss_after_mb": after / 2**20,
        "rss_peak_mb": peak / 2**20,
        "bytes_per_queued_token": (after - base) / queued_tokens,
        "peak_bytes_per_queued_token": (peak - base) / queued_tokens,
        # Growth over the second half only: fixed-size buffers (recent groups, caches) that
        # filled during the first half do not count.
        "marginal_bytes_per_queued_token": (after - middle) / second_half_tokens,
    }


# ---------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------

TARGETS = (
    # (what, ours server, encoding, metric, comparison, target)
    ("tokens/s, JSON, durable store", "ours-sqlite", "json", "tokens_per_s", ">=", 10.0),
    (
        "tokens/s, fast encoding, durable store",
        "ours-sqlite",
        "msgpack",
        "tokens_per_s",
        ">=",
        30.0,
    ),
    ("p99 POST, JSON, durable store", "ours-sqlite", "json", "post_p99_ms", "<=", 0.1),
    ("p99 POST, fast encoding, durable store", "ours-sqlite", "msgpack", "post_p99_ms", "<=", 0.1),
)


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'shape':<30} {'server':<12} {'enc':<7} {'tok/s':>11} {'POST p50':>9} "
        f"{'POST p99':>9} {'GET p50':>9} {'GET p99':>9} {'srvCPU/1k':>9} {'RSS MB':>7} "
        f"{'cliCPU/1k':>9} {'lost':>5} {'dup':>4}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['shape']:<30} {r['server']:<12} {r['encoding']:<7} {r['tokens_per_s']:>11,.0f} "
            f"{r['post_p50_ms']:>9.2f} {r['post_p99_ms']:>9.2f} {r['get_p50_ms']:>9.1f} "
            f"{r['get_p99_ms']:>9.1f} {r['server_cpu_s_per_1k_seq']:>9.3f} "
            f"{r['server_rss_peak_mb']:>7.0f} {r['client_cpu_s_per_1k_seq']:>9.3f} "
            f"{r['lost']:>5} {r['duplicated'] + r['corrupt']:>4}"
        )
    return "\n".join(lines)


def format_backlog(rows: list[dict]) -> str:
    head = (
        f"{'shape':<30} {'server':<12} {'queued tokens':>13} {'RSS base':>9} {'RSS after':>9} "
        f"{'B/token':>8} {'peak B/token':>12} {'2nd-half B/token':>16}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['shape']:<30} {r['server']:<12} {r['queued_tokens']:>13,} "
            f"{r['rss_base_mb']:>9.0f} {r['rss_after_mb']:>9.0f} "
            f"{r['bytes_per_queued_token']:>8.1f} {r['peak_bytes_per_queued_token']:>12.1f} "
            f"{r['marginal_bytes_per_queued_token']:>16.1f}"
        )
    return "\n".join(lines)


def ratios(rows: list[dict], backlog: list[dict]) -> list[dict]:
    out = []
    by_key = {(r["shape"], r["server"], r["encoding"]): r for r in rows}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        base = by_key.get((shape, "atropos", "json"))
        if base is None:
            continue
        for what, server, encoding, metric, op, target in TARGETS:
            ours = by_key.get((shape, server, encoding))
            if ours is None or not base[metric]:
                continue
            ratio = ours[metric] / base[metric]
            met = ratio >= target if op == ">=" else ratio <= target
            out.append(
                {
                    "shape": shape,
                    "what": what,
                    "ratio": ratio,
                    "target": f"{op} {target:g}",
                    "met": met,
                }
            )
        for server, encoding in (("ours-sqlite", "json"), ("ours-sqlite", "msgpack")):
            ours = by_key.get((shape, server, encoding))
            if ours is not None and ours["server_cpu_s_per_1k_seq"] > 0:
                value = base["server_cpu_s_per_1k_seq"] / ours["server_cpu_s_per_1k_seq"]
                out.append(
                    {
                        "shape": shape,
                        "what": f"server CPU/seq Atropos÷ours, {encoding} (info)",
                        "ratio": value,
                        "target": "-",
                        "met": None,
                    }
                )
    for r in backlog:
        if r["server"] != "atropos":
            value = r["bytes_per_queued_token"]
            out.append(
                {
                    "shape": r["shape"],
                    "what": f"RSS bytes per queued token ({r['server']})",
                    "ratio": value,
                    "target": "<= 10",
                    "met": value <= 10.0,
                }
            )
    return out


def _verdict(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "NO")


def format_ratios(items: list[dict]) -> str:
    lines = [f"{'shape':<30} {'ours/Atropos':<42} {'value':>8}  target   met"]
    for item in items:
        lines.append(
            f"{item['shape']:<30} {item['what']:<42} {item['ratio']:>8.3g}  "
            f"{item['target']:<8} {_verdict(item['met'])}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------


def shapes_for(quick: bool, longer: int = 1) -> tuple[list[Shape], list[Shape]]:
    """Closed-loop shapes (``longer`` times the groups) and backlog shapes (2.6M/3.1M tokens).

    ``quick`` takes a quarter of everything.
    """
    scale = 4 if quick else 1
    return (
        [
            Shape(4, 8, 512, 64, groups_per_env=96 * longer // scale),
            Shape(4, 16, 4096, 256, groups_per_env=16 * longer // scale),
        ],
        [
            Shape(4, 8, 512, 64, groups_per_env=160 // scale),
            Shape(4, 16, 4096, 256, groups_per_env=12 // scale),
        ],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (~1 min)")
    parser.add_argument("--skip-atropos", action="store_true", help="only our broker")
    parser.add_argument(
        "--only", default=",".join(SERVERS), help=f"comma-separated servers from {SERVERS}"
    )
    parser.add_argument("--encodings", default="json,msgpack", help="comma-separated: json,msgpack")
    parser.add_argument(
        "--shapes", default="1,2", help="closed-loop shapes to run: 1 (L=512), 2 (L=4096)"
    )
    parser.add_argument("--no-backlog", action="store_true", help="skip the backlog run")
    parser.add_argument(
        "--backlog-only", action="store_true", help="only the backlog run (no closed loop)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per row; the fastest is kept (busy hosts)"
    )
    parser.add_argument(
        "--longer",
        type=int,
        default=1,
        help="closed-loop runs post this many times the groups (steadier figures: our runs "
        "last well under a second at 1)",
    )
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument(
        "--ours-src", type=Path, default=ROOT, help="source tree of our atroposlib (default: here)"
    )
    args = parser.parse_args(argv)
    ours_src = args.ours_src.resolve()
    if not (ours_src / "atroposlib" / "api").is_dir():
        parser.error(f"--ours-src {ours_src} has no atroposlib/api")
    sys.path.insert(0, str(ours_src))
    servers = [s for s in args.only.split(",") if s]
    unknown = set(servers) - set(SERVERS)
    if unknown:
        parser.error(f"unknown server(s) {sorted(unknown)}; choose from {SERVERS}")
    if args.skip_atropos:
        servers = [s for s in servers if s != "atropos"]
    encodings = [e for e in args.encodings.split(",") if e]
    if set(encodings) - {"json", "msgpack"}:
        parser.error("--encodings takes json and/or msgpack")
    if "atropos" in servers:
        ensure_atropos_venv()
    shapes, backlog_shapes = shapes_for(args.quick, max(1, args.longer))
    try:
        picked = sorted({int(x) for x in args.shapes.split(",") if x})
        shapes = [shapes[i - 1] for i in picked]
    except (ValueError, IndexError):
        parser.error("--shapes takes 1 and/or 2, e.g. --shapes 2")

    rows: list[dict] = []
    backlog: list[dict] = []
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    load_before = os.getloadavg()
    print(
        f"host: {os.cpu_count()} CPUs, load average {load_before[0]:.1f}, "
        f"python {sys.version.split()[0]}; client: minimal HTTP/1.1 keep-alive (this script), "
        f"Accept-Encoding: {ACCEPT_ENCODING}, uncompressed posts",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="broker-bench-") as tmp:
        for shape in [] if args.backlog_only else shapes:
            for server in servers:
                for encoding in encodings:
                    if server == "atropos" and encoding != "json":
                        continue
                    runs = [
                        throughput_row(
                            server, shape, encoding, Path(tempfile.mkdtemp(dir=tmp)), ours_src
                        )
                        for _ in range(args.repeat)
                    ]
                    row = max(runs, key=lambda r: r["tokens_per_s"])
                    row["repeats_tokens_per_s"] = [r["tokens_per_s"] for r in runs]
                    rows.append(row)
                    print(
                        f"  {shape.label} {server} {encoding}: {row['tokens_per_s']:,.0f} tok/s "
                        f"in {row['wall_s']:.1f} s, lost {row['lost']} dup {row['duplicated']}",
                        flush=True,
                    )
        if not args.no_backlog:
            for shape in backlog_shapes:
                for server in servers:
                    workdir = Path(tempfile.mkdtemp(dir=tmp))
                    backlog.append(backlog_row(server, shape, workdir, ours_src))
                    per_token = backlog[-1]["bytes_per_queued_token"]
                    print(
                        f"  backlog {shape.label} {server}: {per_token:.1f} B/token",
                        flush=True,
                    )

    load_after = os.getloadavg()
    print(
        f"\nload average (1 min) before/after: {load_before[0]:.1f}/{load_after[0]:.1f} on "
        f"{os.cpu_count()} CPUs; wall-clock figures are only comparable on an idle host"
    )
    print("\nClosed loop (latencies in ms; CPU in seconds per 1k sequences; dup = dup+corrupt)")
    print(format_table(rows))
    if backlog:
        print(
            "\nOpen-loop backlog (no trainer pulling; RSS in MB, growth in bytes per queued token)"
        )
        print(format_backlog(backlog))
    checks = ratios(rows, backlog)
    if checks:
        print("\nOurs vs Atropos (same run) against the targets")
        print(format_ratios(checks))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": sys.argv,
                    "cpus": os.cpu_count(),
                    "load_average_before_after": [load_before[0], load_after[0]],
                    "rows": rows,
                    "backlog": backlog,
                    "ratios": checks,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
