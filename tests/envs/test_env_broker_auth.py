"""``serve`` against a broker that requires a bearer token (``run-api --api-key``).

A real broker process on a free port; the example env's CLI as users run it. With the key
(``ATROPOS_API_KEY``, the variable the broker itself reads) groups arrive; without it, or
with a wrong one, the env stops at once with a one-line reason instead of retrying.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
from envs_testlib import Process, broker_process, child_env, env_command
from example_env import AdditionEnv

from atroposlib.envs.cli import parse_settings
from atroposlib.envs.sender import GroupSender
from atroposlib.envs.spool import Spool
from atroposlib.errors import BrokerRejectedError

KEY = "s3cret-broker-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def locked_broker(tmp_path: Path) -> Iterator[Process]:
    process = broker_process(tmp_path, "memory", None, "--api-key", KEY).start()
    yield process
    process.stop()


@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    log: Path

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        """Its exit status and output (killed when it has not exited within ``timeout``)."""
        try:
            return self.process.wait(timeout=timeout), self.log.read_text()
        finally:
            self.process.kill()


def start_serve(broker: Process, tmp_path: Path, *flags: str, key: str | None) -> Serve:
    environ = child_env()
    environ.pop("ATROPOS_API_KEY", None)
    if key is not None:
        environ["ATROPOS_API_KEY"] = key
    log = tmp_path / "env.log"
    process = subprocess.Popen(
        env_command("serve", f"--env.rollout_server_url={broker.url}", *flags),
        env=environ, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=tmp_path,
    )  # fmt: skip
    return Serve(process, log)


def register_trainer(url: str) -> None:
    body = {"wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 512,
            "checkpoint_dir": "ckpt", "save_checkpoint_interval": 0, "starting_step": 0,
            "num_steps": 100}  # fmt: skip
    httpx.post(url + "/register", json=body, headers=AUTH).raise_for_status()
    httpx.get(url + "/batch", headers=AUTH).raise_for_status()


def test_serve_with_the_brokers_key_delivers_groups(
    locked_broker: Process, fake: Process, tmp_path: Path
) -> None:
    assert httpx.get(locked_broker.url + "/status").status_code == 401  # the lock is on
    register_trainer(locked_broker.url)
    env = start_serve(locked_broker, tmp_path, f"--openai.base_url={fake.url}/v1",
                      "--env.total_steps=1", "--env.steps_per_eval=0", key=KEY)  # fmt: skip
    batch = None
    for _ in range(600):
        batch = httpx.get(locked_broker.url + "/batch", headers=AUTH).json()["batch"]
        if batch or env.process.poll() is not None:
            break
        time.sleep(0.1)
    returncode, output = env.finish()
    assert returncode == 0, output[-3000:]
    assert batch and len(batch[0]["scores"]) == 4
    assert KEY not in output


@pytest.mark.parametrize(
    ("flags", "key", "reason"),
    [
        ((), None, "requires an API key (401)"),
        (("--env.rollout_server_api_key=wrong-key",), KEY, "refused the API key this env sent"),
    ],
)
def test_serve_without_the_right_key_stops_with_one_line(
    locked_broker: Process, tmp_path: Path, flags: tuple[str, ...], key: str | None, reason: str
) -> None:
    returncode, output = start_serve(locked_broker, tmp_path, *flags, key=key).finish()
    assert returncode == 1, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: the broker at http://127.0.0.1:") and reason in last
    assert "set ATROPOS_API_KEY or --env.rollout_server_api_key" in last
    assert "Traceback" not in output and "wrong-key" not in output


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {}, None),
        ([], {"ATROPOS_API_KEY": "shared"}, "shared"),
        ([], {"ATROPOS_API_KEY": "shared", "ATROPOS_ENV__ROLLOUT_SERVER_API_KEY": "own"}, "own"),
        (["--env.rollout_server_api_key", "flag"], {"ATROPOS_API_KEY": "shared"}, "flag"),
    ],
)
def test_the_key_comes_from_the_flag_then_its_variable_then_atropos_api_key(
    argv: list[str], environ: dict[str, str], expected: str | None
) -> None:
    settings = parse_settings(AdditionEnv, "serve", argv, environ=environ)
    secret = settings.env.rollout_server_api_key
    assert (secret.get_secret_value() if secret else None) == expected
    if expected is not None:  # dumps (wandb config, checkpoints) and reprs hide it
        assert expected not in repr(settings) + str(settings.env.model_dump(mode="json"))


def test_a_key_in_the_yaml_is_below_atropos_api_key(tmp_path: Path) -> None:
    config = tmp_path / "env.yaml"
    config.write_text("env:\n  rollout_server_api_key: from-yaml\n")
    argv = ["--config", str(config)]
    from_yaml = parse_settings(AdditionEnv, "serve", argv, environ={})
    assert from_yaml.env.rollout_server_api_key.get_secret_value() == "from-yaml"
    shared = parse_settings(AdditionEnv, "serve", argv, environ={"ATROPOS_API_KEY": "shared"})
    assert shared.env.rollout_server_api_key.get_secret_value() == "shared"


class LockedPoster:
    """Refuses posts with 401 until ``unlock()`` (a broker restarted with another key)."""

    def __init__(self) -> None:
        self.locked, self.accepted = True, []

    def unlock(self) -> None:
        self.locked = False

    async def post_groups(self, groups: list[dict]) -> None:
        if self.locked:
            raise BrokerRejectedError(401, "missing or wrong bearer token")
        self.accepted.extend(group["group_id"] for group in groups)


async def test_groups_refused_with_401_stay_spooled_not_dropped(tmp_path: Path) -> None:
    poster = LockedPoster()
    sender = GroupSender(poster, Spool(tmp_path / "spool.jsonl"), retry_interval_s=0.01)
    sender.start()
    sender.submit({"group_id": "g1", "scores": [1.0]})
    assert not await sender.flush(timeout=0.3)
    assert sender.unauthorized and sender.rejected == 0
    on_disk = (tmp_path / "spool.jsonl").read_bytes()  # for the next run
    assert [orjson.loads(line)["add"]["group_id"] for line in on_disk.splitlines()] == ["g1"]
    poster.unlock()
    assert await sender.flush(timeout=5)
    assert poster.accepted == ["g1"] and not sender.unauthorized
    await sender.close()
