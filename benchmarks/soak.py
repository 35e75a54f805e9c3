"""Soak: envs, broker and trainer for N minutes; the broker is killed every 30 s, the disk fills.

- the broker: ``python -m atroposlib.api`` on a durable store on a small filesystem (a tmpfs
  of ``--disk-mb`` when this runs as root, else a ``--min-free-bytes`` floor on the real disk
  that leaves the same room), killed with -9 every ``--kill-every`` seconds and started again;
- the disk: every ``--fill-every`` seconds a file takes all its free space for
  ``--fill-seconds`` seconds, then is removed (the broker answers 503 meanwhile);
- ``--envs`` env processes submit groups through the env runner's own delivery path
  (``GroupSender`` + ``Spool`` + ``EnvClient``: retries, on-disk spool, idempotency keys),
  half of them as JSON and half as msgpack; every group carries a unique marker;
- one trainer (``TrainerClient``, acknowledging: it names the last step it received) pulls
  batches as fast as it can, acknowledges every 5 steps, and records every marker.

At the end the kills and fills stop, the envs flush their spools, and the trainer takes what
is left. Prints groups posted, delivered, lost, duplicated, broker kills and the broker's peak
RSS per period; exits 1 unless lost and duplicated are 0.

    python benchmarks/soak.py --minutes 10
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from atroposlib.client import EnvClient, TrainerClient  # noqa: E402
from atroposlib.envs.sender import GroupSender  # noqa: E402
from atroposlib.envs.spool import Spool  # noqa: E402
from atroposlib.errors import BrokerError  # noqa: E402
from atroposlib.utils.health import wait_healthy  # noqa: E402
from atroposlib.wire.broker import EnvRegistration, TrainerRegistration  # noqa: E402

MiB = 1024 * 1024
GROUP_SIZE, BATCH_SIZE, SEQ_LEN = 2, 4, 384
MARKER_STRIDE = 10_000_000  # env k's markers are k * stride + n
PADDING_MARKER = 2**30


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _group(marker: int) -> dict[str, Any]:
    tokens = [[marker, marker + 1, *((marker + i) % 30_000 for i in range(SEQ_LEN - 2))]]
    tokens.append([marker + 1, *tokens[0][1:]])
    masks = [[-100] * 16 + row[16:] for row in tokens]
    return {"tokens": tokens, "masks": masks, "scores": [1.0, 0.0]}


# ---- the disk --------------------------------------------------------------------------


class Disk:
    """A small filesystem for the store (tmpfs as root, else a floor on the real disk)."""

    def __init__(self, folder: Path, size: int) -> None:
        self.folder, self.size = folder, size
        folder.mkdir(parents=True, exist_ok=True)
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
        self.mounted = os.geteuid() == 0 and subprocess.run(mount, check=False).returncode == 0
        self.extra_floor = 0 if self.mounted else max(0, shutil.disk_usage(folder).free - size)
        self.filler = folder / "filler"

    def free(self) -> int:
        return max(0, shutil.disk_usage(self.folder).free - self.extra_floor)

    def fill(self) -> None:
        try:
            with self.filler.open("ab") as handle:
                while (room := self.free()) > 0:
                    handle.write(b"\xff" * min(room, MiB))
                    handle.flush()
        except OSError:  # full: that is the point
            pass

    def drain(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        self.drain()
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.folder)], check=False)


# ---- the broker ------------------------------------------------------------------------


class Broker:
    def __init__(self, disk: Disk, log: Path) -> None:
        self.disk, self.log, self.port = disk, log, _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0
        self.peak_rss: list[int] = []  # per period, filled by the monitor

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [
            sys.executable, "-m", "atroposlib.api", "--port", str(self.port),
            "--store", f"sqlite:{self.disk.folder / 'broker.sqlite3'}", "--log-level", "warning",
            "--min-free-bytes", str(4 * MiB + self.disk.extra_floor),
            "--segment-bytes", str(MiB), "--retry-after-seconds", "1",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        wait_healthy(f"{self.url}/health", timeout_s=60, poll_s=0.05, process=self.proc,
                     log_path=self.log, name="the broker")  # fmt: skip

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.kills += 1

    def rss(self) -> int:
        try:
            return psutil.Process(self.proc.pid).memory_info().rss if self.proc else 0
        except psutil.Error:
            return 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


# ---- envs (processes) ------------------------------------------------------------------


def env_main(index: int, url: str, folder: str, encoding: str, per_second: float) -> None:
    logging.basicConfig(level=logging.ERROR)  # retries and spooling are the point here
    asyncio.run(_env(index, url, Path(folder), encoding, per_second))


async def _env(index: int, url: str, folder: Path, encoding: str, per_second: float) -> None:
    stop, posted = folder / "stop", (folder / f"posted-{index}.txt").open("a")
    async with EnvClient(url, encoding=encoding, max_retries=1, backoff=0.2) as client:  # type: ignore[arg-type]
        registration = EnvRegistration(
            max_token_length=SEQ_LEN, desired_name=f"soak{index}", weight=1.0,
            group_size=GROUP_SIZE,
        )  # fmt: skip

        async def register() -> int:
            while True:
                try:
                    return (await client.register_env(registration)).env_id
                except BrokerError:
                    await asyncio.sleep(0.5)

        env_id = await register()
        spool = Spool(folder / "spool" / f"soak{index}.jsonl")
        sender = GroupSender(client, spool, on_unknown_env=register, retry_interval_s=0.3)
        sender.start()
        number = 0
        while not stop.exists():
            if sender.backlog > 400:  # the broker is away or full: wait, as the runner does
                await asyncio.sleep(0.1)
                continue
            marker = index * MARKER_STRIDE + 2 * number
            group = {**_group(marker), "env_id": env_id, "group_id": f"soak-{index}-{number}"}
            sender.submit(group)
            posted.write(f"{marker}\n")
            posted.flush()
            number += 1
            await asyncio.sleep(1 / per_second)
        flushed = await sender.flush(timeout=300)
        await sender.close()
        (folder / f"done-{index}.txt").write_text(f"{number} {int(flushed)} {len(spool)}\n")


# ---- the trainer (a thread) ------------------------------------------------------------


class Trainer(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.client = TrainerClient(url, encoding="msgpack", timeout=10)
        self.markers: list[int] = []
        self.steps = 0
        self.stopping = threading.Event()
        self.errors = 0

    def register(self) -> None:
        registration = TrainerRegistration(
            wandb_group="soak", wandb_project="soak", batch_size=BATCH_SIZE,
            max_token_len=SEQ_LEN, checkpoint_dir="soak", save_checkpoint_interval=5,
            starting_step=0, num_steps=10**9, acknowledges=True,
        )  # fmt: skip
        self.client.register(registration)

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                batch = self.client.get_batch()
                if batch is None:
                    time.sleep(0.02)
                    continue
                self.markers += [int(g["tokens"][0][0]) for g in batch.groups]
                self.steps += 1
                if batch.step is not None and batch.step % 5 == 0:
                    self.client.ack(batch.step)
            except BrokerError:
                self.errors += 1
                time.sleep(0.2)


# ---- the run ---------------------------------------------------------------------------


def _periodic(stop: threading.Event, every: float, action: Any) -> threading.Thread:
    def loop() -> None:
        while not stop.wait(every):
            action()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def run(args: argparse.Namespace, folder: Path) -> int:
    disk = Disk(folder / "disk", args.disk_mb * MiB)
    broker = Broker(disk, folder / "broker.log")
    print(f"store on {'a tmpfs' if disk.mounted else 'a floor on the real disk'} of "
          f"{args.disk_mb} MiB; log {broker.log}", flush=True)  # fmt: skip
    broker.start()
    trainer = Trainer(broker.url)
    trainer.register()
    httpx.get(f"{broker.url}/batch", params={"received": 0})  # the trainer has started
    trainer.start()
    ctx = mp.get_context("spawn")
    envs = [
        ctx.Process(
            target=env_main,
            args=(i, broker.url, str(folder), "json" if i % 2 else "msgpack", args.rate),
        )
        for i in range(args.envs)
    ]
    for env in envs:
        env.start()

    stop, period_rss, period_free = threading.Event(), [0], [disk.free()]
    fills = [0]

    def restart() -> None:
        broker.kill9()
        broker.start()

    def monitor() -> None:
        period_rss[-1] = max(period_rss[-1], broker.rss())
        period_free[-1] = min(period_free[-1], disk.free())

    def fill() -> None:
        fills[0] += 1
        disk.fill()
        time.sleep(args.fill_seconds)
        disk.drain()

    started = time.monotonic()
    threads = [
        _periodic(stop, args.kill_every, restart),
        _periodic(stop, 0.2, monitor),
        _periodic(stop, args.fill_every, fill),
    ]
    while (left := args.minutes * 60 - (time.monotonic() - started)) > 0:
        time.sleep(min(60, left))
        elapsed = (time.monotonic() - started) / 60
        print(f"{elapsed:5.1f} min: delivered {len(trainer.markers)} groups in {trainer.steps} "
              f"batches, broker kills {broker.kills}, disk fills {fills[0]} (least free this "
              f"minute {period_free[-1] / MiB:.1f} MiB), broker peak RSS this minute "
              f"{period_rss[-1] / MiB:.0f} MiB", flush=True)  # fmt: skip
        period_rss.append(0)
        period_free.append(disk.free())
    stop.set()
    for thread in threads:
        thread.join()
    disk.drain()
    if broker.proc is None or broker.proc.poll() is not None:
        broker.start()

    (folder / "stop").touch()
    for env in envs:
        env.join(timeout=600)
    posted: list[int] = []
    for index in range(args.envs):
        posted += [int(line) for line in (folder / f"posted-{index}.txt").read_text().split()]
    _drain(broker, trainer, posted)
    trainer.stopping.set()
    trainer.join(timeout=30)
    broker.stop()
    disk.close()
    return _report(args, posted, trainer, broker, [r for r in period_rss if r])


def _drain(broker: Broker, trainer: Trainer, posted: list[int]) -> None:
    """Let the trainer take everything; one padding group completes a last partial batch."""
    wanted = set(posted)
    deadline = time.monotonic() + 300
    padded = False
    while time.monotonic() < deadline and not wanted <= set(trainer.markers):
        time.sleep(1)
        queued = httpx.get(f"{broker.url}/status").json()["queue_size"]
        if not padded and 0 < queued * GROUP_SIZE < BATCH_SIZE:
            for extra in range(BATCH_SIZE // GROUP_SIZE - queued):
                group = {**_group(PADDING_MARKER + 2 * extra), "group_id": f"pad-{extra}"}
                httpx.post(f"{broker.url}/scored_data", json=group)
            padded = True


def _report(
    args: argparse.Namespace, posted: list[int], trainer: Trainer, broker: Broker,
    period_rss: list[int],
) -> int:  # fmt: skip
    delivered = [m for m in trainer.markers if m < PADDING_MARKER]
    lost = len(set(posted) - set(delivered))
    duplicated = len(delivered) - len(set(delivered))
    strangers = len(set(delivered) - set(posted))
    half = max(1, len(period_rss) // 2)
    print(f"minutes {args.minutes}, envs {args.envs}, broker kills {broker.kills}")
    print(f"groups posted {len(posted)}, delivered {len(set(delivered))}, lost {lost}, "
          f"duplicated {duplicated}, unknown {strangers}")  # fmt: skip
    print(f"trainer batches {trainer.steps}, trainer errors waited out {trainer.errors}")
    print(f"broker peak RSS {max(period_rss, default=0) / MiB:.0f} MiB (first half "
          f"{max(period_rss[:half], default=0) / MiB:.0f} MiB, second half "
          f"{max(period_rss[half:], default=0) / MiB:.0f} MiB; per minute: "
          f"{', '.join(f'{r / MiB:.0f}' for r in period_rss)})")  # fmt: skip
    return 0 if lost == 0 and duplicated == 0 and strangers == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--envs", type=int, default=3)
    parser.add_argument("--rate", type=float, default=40, help="groups per second per env")
    parser.add_argument("--kill-every", type=float, default=30)
    parser.add_argument("--fill-every", type=float, default=75)
    parser.add_argument("--fill-seconds", type=float, default=15)
    parser.add_argument("--disk-mb", type=int, default=64)
    parser.add_argument("--folder", type=Path, help="keep logs and spools here")
    args = parser.parse_args()
    if args.folder:
        args.folder.mkdir(parents=True, exist_ok=True)
        return run(args, args.folder)
    with tempfile.TemporaryDirectory() as folder:
        return run(args, Path(folder))


if __name__ == "__main__":
    sys.exit(main())
