"""Fuzz the broker: N hostile requests over every route, both encodings, with and without auth.

Two real brokers (``python -m atroposlib.api`` on a durable store; one with an API key) get
mutated requests: valid bodies of every route (JSON and msgpack) with a leaf replaced by a
hostile value (NaN, 2**64, lone surrogates, deep nesting, a msgpack map with a list as key, ...),
keys dropped or added, bodies cut, flipped, gzipped or garbage, odd query strings, headers
(non-ASCII bearer tokens, foreign Host/Origin, bad encodings) and unknown paths; valid flows
(register, post, batch, ack) run between them so that deep states are reached too. Every answer
of 500 or more is counted and the first ones are printed; at the end each broker is killed
(-9) and must start again on its store.

    python benchmarks/fuzz_broker.py                    # 100,000 requests (~10 min)
    python benchmarks/fuzz_broker.py --requests 2000    # a smoke run

Prints ``requests N, responses >= 500: K`` and exits 1 when K > 0 or a store does not reopen.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgpack

from atroposlib.utils.health import wait_healthy

REPO_ROOT = Path(__file__).resolve().parents[1]
API_KEY = "fuzz-key"

HOSTILE: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, -(2**31) - 1, 2**53, 2**63 - 1, 2**63, -(2**63) - 1,
    2**64, 10**30, -(10**30), 1.5, -0.0, 1e308, -1e308, 5e-324, float("nan"), float("inf"),
    float("-inf"), "", "x", "x" * 5000, "\u00e9\u4e2d\U0001f600", "\ud800", "\x00", "1", "NaN",
    [], [[]], [[[]]], {}, {"": None}, [None], [1, "a"], [[1, 2], [3]], [[True]], [[1.5]],
    [{"role": "user", "content": "hi"}], [[{"role": 1}]], [[2**40]], [["\ud800"]],
]  # fmt: skip
HOSTILE_TEXT = [
    "", "-1", "0", "1", "1.5", "nan", "inf", "1e400", str(2**63), str(2**70), "x", "%00",
    "\u00e9", "99999999999999999999999999", " 1", "0x10", "true", "[]",
]  # fmt: skip


def _group(rng: random.Random, env_id: int | None = None) -> dict[str, Any]:
    size, length = rng.randint(1, 3), rng.randint(1, 8)
    tokens = [[rng.randrange(50_000) for _ in range(length)] for _ in range(size)]
    group: dict[str, Any] = {
        "tokens": tokens,
        "masks": [[-100, *row[1:]] for row in tokens],
        "scores": [rng.random() for _ in range(size)],
        "group_id": f"{rng.getrandbits(64):x}",
    }
    if env_id is not None:
        group["env_id"] = env_id
    for name in rng.sample(["advantages", "inference_logprobs", "ref_logprobs"], rng.randint(0, 2)):
        group[name] = [[rng.random() for _ in row] for row in tokens]
    if rng.random() < 0.3:
        group["messages"] = [[{"role": "user", "content": "q"}] for _ in tokens]
        group["overrides"] = [{"temperature": 1.0} for _ in tokens]
        group["policy_version"] = rng.randint(0, 10)
    return group


def _bodies(rng: random.Random) -> dict[tuple[str, str], Any]:
    """A valid body (or None) for every route."""
    return {
        ("GET", "/"): None, ("GET", "/health"): None, ("GET", "/metrics"): None,
        ("GET", "/info"): None, ("GET", "/wandb_info"): None, ("GET", "/status"): None,
        ("GET", "/latest_example"): None, ("GET", "/recent_groups"): None,
        ("GET", "/batch"): None, ("GET", "/status-env"): {"env_id": rng.randint(0, 3)},
        ("POST", "/register"): {
            "wandb_group": "g", "wandb_project": "p", "batch_size": rng.choice([2, 4, 8]),
            "max_token_len": 64, "checkpoint_dir": "c", "save_checkpoint_interval": 10,
            "starting_step": rng.randint(0, 3), "num_steps": 100,
            "acknowledges": rng.random() < 0.5, "max_staleness": rng.choice([None, 2]),
        },
        ("POST", "/register-env"): {
            "max_token_length": 64, "desired_name": "env", "weight": 1.0, "group_size": 2,
            "min_batch_allocation": rng.choice([None, 0.2]),
        },
        ("POST", "/disconnect-env"): {"env_id": rng.randint(0, 3)},
        ("POST", "/ack"): {"step": rng.randint(0, 20)},
        ("POST", "/scored_data"): _group(rng, rng.choice([None, 0, 1])),
        ("POST", "/scored_data_list"): [_group(rng) for _ in range(rng.randint(1, 4))],
        ("GET", "/reset_data"): None,
    }  # fmt: skip


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if len(prefix) >= 6:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value[:4]):
            yield from _paths(item, (*prefix, index))


def _set(root: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = root
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return root


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@dataclass
class Request:
    method: str
    path: str
    content: bytes = b""
    headers: dict[str, Any] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)


class Mutator:
    """Seeded hostile requests built from valid ones."""

    def __init__(self, seed: int, api_key: str | None) -> None:
        self.rng = random.Random(seed)
        self.api_key = api_key

    def _mutate_value(self, body: Any) -> Any:
        rng = self.rng
        body = copy.deepcopy(body)
        for _ in range(rng.randint(1, 3)):
            paths = list(_paths(body))
            path = rng.choice(paths)
            roll = rng.random()
            if roll < 0.6:
                body = _set(body, path, rng.choice(HOSTILE))
            elif roll < 0.7:
                body = _set(body, path, _deep(rng.choice([50, 600, 5000])))
            elif roll < 0.85 and path and isinstance(_get(body, path[:-1]), dict):
                del _get(body, path[:-1])[path[-1]]
            elif isinstance(_get(body, path), dict):
                _get(body, path)[rng.choice(["extra", "tokens", "", "\u00e9", "env_id"])] = (
                    rng.choice(HOSTILE)
                )
            elif isinstance(_get(body, path), list):
                _get(body, path).extend(rng.choice(HOSTILE) for _ in range(rng.randint(1, 3)))
        return body

    def _encode(self, body: Any, msgpack_body: bool) -> tuple[bytes, str]:
        if msgpack_body:
            try:
                return msgpack.packb(body, use_bin_type=True), "application/msgpack"
            except (OverflowError, TypeError, ValueError, UnicodeEncodeError):
                pass
        try:
            return json.dumps(body).encode("utf-8", "surrogatepass"), "application/json"
        except (RecursionError, ValueError):
            return b"[" * 100_000, "application/json"

    def _raw_msgpack(self) -> bytes:
        rng = self.rng
        choices = [
            b"\x81\x91\x01\x02",  # {[1]: 2}: a map with a list as key
            b"\x81\x81\x01\x02\x03",  # {{1: 2}: 3}
            b"\x81\xc4\x01x\x01",  # {b"x": 1}
            b"\xd4\x01\x00",  # an ext type
            b"\xcf" + b"\xff" * 8,  # uint64 max
            b"\xdd\xff\xff\xff\xff",  # an array claiming 4 billion items
            b"\xdf\x00\x00\x00\x10",  # a map claiming 16 items, none there
            rng.randbytes(rng.randint(0, 64)),
        ]
        return rng.choice(choices)

    def request(self, bodies: dict[tuple[str, str], Any]) -> Request:
        rng = self.rng
        (method, path), body = rng.choice(list(bodies.items()))
        msgpack_body = rng.random() < 0.5
        request = Request(method, path)
        roll = rng.random()
        if body is not None or rng.random() < 0.2:
            if roll < 0.55:
                body = self._mutate_value(body)
            content, media = self._encode(body, msgpack_body)
            if roll > 0.9:
                content, media = self._raw_msgpack(), "application/msgpack"
            elif roll > 0.85:
                content = bytearray(content)
                for _ in range(rng.randint(1, 4)):
                    if content:
                        content[rng.randrange(len(content))] = rng.randrange(256)
                content = bytes(content[: rng.randint(0, len(content))])
            request.content = content
            request.headers["content-type"] = rng.choice([media] * 6 + ["text/plain", "x/y;;"])
            if rng.random() < 0.15:
                request.content = gzip.compress(request.content)
                if rng.random() < 0.3:
                    request.content = request.content[: len(request.content) // 2]
                request.headers["content-encoding"] = rng.choice(["gzip"] * 4 + ["br", "x"])
        if rng.random() < 0.2:
            name = rng.choice(["received", "env_id", "limit", "x"])
            request.params[name] = rng.choice(HOSTILE_TEXT)
        self._headers(request)
        if rng.random() < 0.02:
            request.path = rng.choice(["/nope", "/batch/", "//batch", "/scored_data?x", "/%ff"])
        if rng.random() < 0.02:
            request.method = rng.choice(["PUT", "DELETE", "PATCH", "GET", "POST"])
        return request

    def _headers(self, request: Request) -> None:
        rng = self.rng
        headers = request.headers
        headers["accept"] = rng.choice(["application/msgpack", "application/json", "*/*", "x"])
        if self.api_key is not None:
            auth = rng.random()
            if auth < 0.8:
                headers["authorization"] = f"Bearer {self.api_key}"
            elif auth < 0.9:
                headers["authorization"] = rng.choice(
                    ["Bearer wrong", "Basic abc", "Bearer", "bearer  " + self.api_key]
                )
            else:
                headers["authorization"] = b"Bearer \xc3\xa9\xff\x80"
        elif rng.random() < 0.05:
            headers["authorization"] = b"Bearer \xc3\xa9\xff"
        if rng.random() < 0.04:
            headers["host"] = rng.choice(["evil.example", "localhost:1", "[::1]", "a:b:c", ""])
        if rng.random() < 0.04:
            headers["origin"] = rng.choice(["https://evil.example", "null", "http://127.0.0.1"])
        if rng.random() < 0.04:
            headers["sec-fetch-site"] = rng.choice(["cross-site", "same-origin", "none", "x"])
        if rng.random() < 0.03:
            headers["accept-encoding"] = rng.choice(["gzip", "br;q=x", "\u00e9".encode()])


def _get(root: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        root = root[key]
    return root


@dataclass
class Report:
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)
    transport_errors: int = 0

    @property
    def errors_500(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


def _valid_flow(client: httpx.Client, rng: random.Random, headers: dict[str, str]) -> None:
    """Register, post and pull for real, so that mutations meet every state."""
    bodies = _bodies(rng)
    client.post("/register", json=bodies[("POST", "/register")], headers=headers)
    client.get("/batch", headers=headers)
    env = client.post("/register-env", json=bodies[("POST", "/register-env")], headers=headers)
    env_id = env.json().get("env_id") if env.status_code == 200 else None
    groups = [_group(rng, env_id) for _ in range(4)]
    client.post("/scored_data_list", json=groups, headers=headers)
    batch = client.get("/batch", params={"received": 0}, headers=headers)
    if batch.status_code == 200 and batch.json().get("step"):
        client.post("/ack", json={"step": batch.json()["step"]}, headers=headers)


def fuzz(url: str, count: int, seed: int, api_key: str | None) -> Report:
    mutator, report = Mutator(seed, api_key), Report()
    auth = {"authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url, timeout=30) as client:
        for index in range(count):
            if index % 50 == 0:
                _valid_flow(client, mutator.rng, auth)
            request = mutator.request(_bodies(mutator.rng))
            try:
                answer = client.request(
                    request.method, request.path, content=request.content or None,
                    headers=request.headers, params=request.params,
                )  # fmt: skip
            except (httpx.TransportError, httpx.InvalidURL, UnicodeError, ValueError):
                report.transport_errors += 1
                continue
            report.requests += 1
            report.statuses[answer.status_code] += 1
            if answer.status_code >= 500 and len(report.server_errors) < 20:
                report.server_errors.append(
                    f"{answer.status_code} {request.method} {request.path} "
                    f"{request.params} {request.headers} {request.content[:300]!r}"
                )
    return report


# ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Broker:
    def __init__(self, store: Path, api_key: str | None) -> None:
        self.store, self.api_key, self.port = store, api_key, _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Broker:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        if self.api_key:
            env["ATROPOS_API_KEY"] = self.api_key
        command = [sys.executable, "-m", "atroposlib.api", "--port", str(self.port)]
        command += ["--store", f"sqlite:{self.store}", "--log-level", "error"]
        with self.store.with_suffix(".log").open("ab") as log:
            self.proc = subprocess.Popen(command, env=env, stderr=log, stdout=log)
        auth = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        wait_healthy(f"{self.url}/health", timeout_s=30, poll_s=0.1, process=self.proc,
                     log_path=self.store.with_suffix(".log"), headers=auth,
                     name=f"the broker on {self.store}")  # fmt: skip
        return self

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def run(total: int, seed: int, folder: Path) -> tuple[Report, bool]:
    """Half the requests to a broker without a key, half to one with; both must reopen."""
    combined, reopened = Report(), True
    for index, api_key in enumerate((None, API_KEY)):
        broker = Broker(folder / f"broker{index}.sqlite3", api_key).start()
        try:
            report = fuzz(broker.url, total // 2, seed + index, api_key)
        finally:
            broker.kill9()
        try:
            broker.start()
        except RuntimeError as err:
            print(f"store did not reopen: {err}")
            reopened = False
        finally:
            broker.kill9()
        combined.requests += report.requests
        combined.statuses.update(report.statuses)
        combined.server_errors += report.server_errors
        combined.transport_errors += report.transport_errors
    return combined, reopened


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep stores and broker logs in this folder")
    args = parser.parse_args()
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            folder = str(args.keep)
        else:
            folder = stack.enter_context(tempfile.TemporaryDirectory())
        report, reopened = run(args.requests, args.seed, Path(folder))
        for line in report.server_errors:
            print("  ", line[:600])
        if report.server_errors:
            for log in sorted(Path(folder).glob("*.log")):
                print(f"--- {log.name} (last 4000 characters)\n{log.read_text()[-4000:]}")
    statuses = ", ".join(f"{code}: {n}" for code, n in sorted(report.statuses.items()))
    print(f"statuses: {statuses}")
    print(f"requests the client could not send: {report.transport_errors}")
    print(f"stores reopened after kill -9: {'yes' if reopened else 'NO'}")
    seconds = time.monotonic() - started
    print(f"requests {report.requests}, responses >= 500: {report.errors_500} in {seconds:.0f} s")
    return 0 if report.errors_500 == 0 and reopened else 1


if __name__ == "__main__":
    sys.exit(main())
