"""atropos-sft-gen / atropos-dpo-gen reading a live broker: a real broker process fed with
the fixture groups over HTTP. The exporter runs in-process (its ``main``) where it runs alone,
and as a separate process where it must run while an env is posting."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.fakes import free_port
from tests.tools.conftest import LiveBroker, ToolRun, fixture_groups, without_env_ids
from tests.tools.fixture_groups import DATA

Run = Callable[..., ToolRun]


def _flags(broker: LiveBroker, tokenizer_dir: str) -> list[str]:
    return [
        "--api-url", broker.url, "--tokenizer", tokenizer_dir,
        "--group-size", "4", "--tasks-per-step", "1", "--poll-interval", "0.2",
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_groups_queued_before_the_exporter_are_exported_not_reset(
    kind: str, live_broker: LiveBroker, tmp_path: Path, tokenizer_dir: str, run_tool: Run
) -> None:
    """Atropos's exporters reset the broker on start; ours keep what is queued."""
    live_broker.post("/scored_data_list", without_env_ids(fixture_groups()))
    assert live_broker.get("/status")["queue_size"] == 3
    out = tmp_path / "out.jsonl"
    run = run_tool(kind, out, *_flags(live_broker, tokenizer_dir), "--idle-timeout", "2")
    assert run.code == 0, run.stderr
    assert out.read_text() == (DATA / f"expected_{kind}.jsonl").read_text()
    assert "from 3 groups (no batch for 2 s)" in run.stderr
    assert live_broker.get("/status") == {"current_step": 3, "queue_size": 0}


@pytest.mark.slow
def test_live_stream_from_registered_envs_stops_at_the_line_target(
    live_broker: LiveBroker, tmp_path: Path, tokenizer_dir: str, subprocess_env: dict[str, str]
) -> None:
    out = tmp_path / "out.jsonl"
    exporter = subprocess.Popen(
        [sys.executable, "-m", "atroposlib.cli.sft", str(out),
         *_flags(live_broker, tokenizer_dir), "--num-seqs-to-save", "5"],
        env=subprocess_env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        env_ids = [_register_env(live_broker, name) for name in ("arith", "colours")]
        for group in fixture_groups():
            live_broker.post("/scored_data", {**group, "env_id": env_ids[group["env_id"]]})
        _, stderr = exporter.communicate(timeout=300)
    finally:
        exporter.kill()
    assert exporter.returncode == 0, stderr
    assert out.read_text() == (DATA / "expected_sft.jsonl").read_text()
    assert "wrote 5 lines" in stderr and "no batch for" not in stderr
    # The third group (nothing positive) was not needed: it stays queued for the next reader.
    assert live_broker.get("/status")["queue_size"] == 1


def _register_env(broker: LiveBroker, name: str) -> int:
    body = {"max_token_length": 2048, "desired_name": name, "weight": 1.0, "group_size": 4}
    deadline = time.monotonic() + 120
    while True:
        answer = broker.post("/register-env", body)
        if answer.get("status") == "success":
            return int(answer["env_id"])
        assert time.monotonic() < deadline, f"env never registered: {answer}"
        time.sleep(0.2)


def test_reset_happens_only_with_the_explicit_flag(
    live_broker: LiveBroker, tmp_path: Path, tokenizer_dir: str, run_tool: Run
) -> None:
    live_broker.post("/scored_data_list", without_env_ids(fixture_groups()))
    out = tmp_path / "out.jsonl"
    flags = [*_flags(live_broker, tokenizer_dir), "--reset-broker", "--idle-timeout", "1"]
    run = run_tool("sft", out, *flags)
    assert run.code == 1
    assert "wrote 0 lines" in run.error_lines[-1]
    assert not out.exists()
    assert live_broker.get("/status")["queue_size"] == 0


def test_unreachable_broker_is_one_line_and_exit_1(
    tmp_path: Path, tokenizer_dir: str, run_tool: Run
) -> None:
    out = tmp_path / "out.jsonl"
    url = f"http://127.0.0.1:{free_port()}"
    run = run_tool("dpo", out, "--api-url", url, "--tokenizer", tokenizer_dir)
    assert run.code == 1
    assert len(run.error_lines) == 1
    assert url in run.error_lines[0] and "unreachable" in run.error_lines[0]
    assert not out.exists()
    with pytest.raises(httpx.TransportError):
        httpx.get(url, timeout=1)


def test_dry_run_touches_nothing(
    live_broker: LiveBroker, tmp_path: Path, tokenizer_dir: str, run_tool: Run
) -> None:
    live_broker.post("/scored_data_list", without_env_ids(fixture_groups()))
    out = tmp_path / "out.jsonl"
    run = run_tool("dpo", out, *_flags(live_broker, tokenizer_dir), "--dry-run")
    assert run.code == 0, run.stderr
    assert "dry run ok: broker at" in run.stderr
    assert not out.exists()
    assert live_broker.get("/status")["queue_size"] == 3
    assert live_broker.get("/info") == {"batch_size": -1, "max_token_len": -1}


def _ctrl_c_as_in_a_terminal() -> None:
    """Run in the child before exec. A shell without job control starts background commands
    with SIGINT ignored, and the child inherits that (so under ``scripts/test &`` the exporter
    never saw the signal and the test waited out its timeout). A user's Ctrl-C in a terminal
    reaches a process whose SIGINT is at its default, so the child gets that default here."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_interrupt_keeps_every_written_line(
    live_broker: LiveBroker, tmp_path: Path, tokenizer_dir: str, subprocess_env: dict[str, str]
) -> None:
    live_broker.post("/scored_data_list", without_env_ids(fixture_groups()))
    out = tmp_path / "out.jsonl"
    exporter = subprocess.Popen(
        [sys.executable, "-m", "atroposlib.cli.sft", str(out), *_flags(live_broker, tokenizer_dir)],
        env=subprocess_env, stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_in_a_terminal,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while live_broker.get("/status")["queue_size"] > 0 or not out.exists():
            assert exporter.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)  # the exporter is now polling an empty broker
        exporter.send_signal(signal.SIGINT)
        _, stderr = exporter.communicate(timeout=60)
    finally:
        exporter.kill()
    assert exporter.returncode == 130, stderr
    assert out.read_text() == (DATA / "expected_sft.jsonl").read_text()
    assert "interrupted; wrote 5 lines" in stderr
