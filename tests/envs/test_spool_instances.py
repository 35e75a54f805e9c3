"""One spool file per running env instance; a restarted instance sends what others left, once.

Instances are real processes (killed with -9 while holding their spool); the groups they left
are then sent by a new instance through ``GroupSender`` to a real broker process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atroposlib.client import EnvClient
from atroposlib.envs.sender import GroupSender
from atroposlib.envs.spool import Spool

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from broker_testlib import BrokerProcess, make_group, trainer_body

_INSTANCE = textwrap.dedent(
    """
    import sys, time
    from atroposlib.envs.spool import Spool
    spool = Spool(sys.argv[1])
    prefix = sys.argv[2]
    spool.add([{"group_id": f"{prefix}{i}", "marker": i} for i in range(5)])
    spool.ack([f"{prefix}0"])  # one was acknowledged before the crash
    print(spool.path, flush=True)
    time.sleep(600)
    """
)


class Instance:
    def __init__(self, spool: Path, prefix: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _INSTANCE, str(spool), prefix], stdout=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.path = Path(self.proc.stdout.readline().strip())

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def instances() -> Iterator[list[Instance]]:
    started: list[Instance] = []
    yield started
    for instance in started:
        if instance.proc.poll() is None:
            instance.kill9()


def test_each_running_instance_gets_its_own_file(tmp_path: Path, instances: list[Instance]) -> None:
    spool = tmp_path / "spool" / "gsm8k.jsonl"
    instances += [Instance(spool, "a"), Instance(spool, "b")]
    assert [i.path.name for i in instances] == ["gsm8k.jsonl", "gsm8k.2.jsonl"]
    third = Spool(spool)  # both others run: their files are not touched
    assert third.path.name == "gsm8k.3.jsonl" and len(third) == 0
    third.close()
    other_env = Spool(tmp_path / "spool" / "gsm8k.v2.jsonl")  # a name that merely starts alike
    assert len(other_env) == 0
    other_env.close()


def test_a_restarted_instance_sends_what_stopped_ones_left_exactly_once(
    tmp_path: Path, instances: list[Instance]
) -> None:
    spool = tmp_path / "spool" / "gsm8k.jsonl"
    instances += [Instance(spool, "a"), Instance(spool, "b"), Instance(spool, "c")]
    instances[0].kill9()
    instances[1].kill9()  # "c" keeps running

    restarted = Spool(spool)
    assert restarted.path == spool
    assert sorted(restarted.pending) == ["a1", "a2", "a3", "a4", "b1", "b2", "b3", "b4"]
    assert not instances[1].path.exists() and instances[2].path.exists()
    restarted.close()
    again = Spool(spool)  # a crash right after adopting: the groups are in its own file
    assert len(again) == 8
    again.close()

    broker = BrokerProcess(f"sqlite:{tmp_path / 'broker.sqlite3'}").start()
    try:
        httpx.post(f"{broker.url}/register", json=trainer_body(batch_size=64))
        sender_spool = Spool(spool)
        for group_id in list(sender_spool.pending):
            sender_spool.pending[group_id] = make_group(2, group_id=group_id)
        sent = _drain(broker.url, sender_spool)
        assert sent == 8 and len(sender_spool) == 0
        assert httpx.get(f"{broker.url}/status").json()["queue_size"] == 8
        instances[2].kill9()
        last = Spool(spool)  # c's leftovers, and nothing that was already sent
        assert sorted(last.pending) == ["c1", "c2", "c3", "c4"]
        for group_id in list(last.pending):
            last.pending[group_id] = make_group(2, group_id=group_id)
        assert _drain(broker.url, last) == 4
        assert httpx.get(f"{broker.url}/status").json()["queue_size"] == 12
    finally:
        broker.stop()


def _drain(url: str, spool: Spool) -> int:
    import asyncio

    async def run() -> int:
        async with EnvClient(url, encoding="json") as client:
            sender = GroupSender(client, spool, retry_interval_s=0.05)
            sender.start()
            deadline = time.monotonic() + 30
            while len(spool) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await sender.close()
            return sender.sent

    return asyncio.run(run())
