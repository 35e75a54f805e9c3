"""The thread governor: the cores other processes leave idle, measured, and given back fast."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atroposlib.inference.settings import InferenceSettings
from atroposlib.inference.threads import ThreadGovernor, machine_busy_seconds


class Machine:
    """A fake clock with the machine's and this process's busy CPU seconds."""

    def __init__(self) -> None:
        self.now = self.busy = self.own = 0.0

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        self.now += seconds
        self.own += own_cores * seconds
        self.busy += (own_cores + other_cores) * seconds


def governor(machine: Machine, base: int = 1, most: int = 2, cores: int = 2) -> ThreadGovernor:
    return ThreadGovernor(
        base, most, cores=cores, period_s=0.25,
        busy=lambda: machine.busy, own=lambda: machine.own, clock=lambda: machine.now,
    )  # fmt: skip


def test_idle_cores_are_taken_and_given_back_within_one_period() -> None:
    machine = Machine()
    threads = governor(machine)
    assert threads.threads_now() == 1  # nothing measured yet
    machine.run(0.3, own_cores=1.0, other_cores=0.05)  # the trainer waits for a batch
    assert threads.threads_now() == 2
    machine.run(0.1, own_cores=2.0, other_cores=0.0)
    assert threads.threads_now() == 2  # within the period: not measured again
    machine.run(0.3, own_cores=1.4, other_cores=0.6)  # the trainer computes again
    assert threads.threads_now() == 1
    machine.run(0.3, own_cores=1.0, other_cores=1.0)
    assert threads.threads_now() == 1


@pytest.mark.parametrize(
    ("cores", "others", "expected"),
    [(4, 0.0, 4), (4, 1.0, 3), (4, 1.2, 3), (4, 1.3, 2), (4, 3.9, 1), (8, 0.2, 6)],
)
def test_never_more_than_most_nor_fewer_than_base(cores: int, others: float, expected: int) -> None:
    machine = Machine()
    threads = governor(machine, base=1, most=6, cores=cores)
    machine.run(1.0, own_cores=1.0, other_cores=others)
    assert threads.threads_now() == expected


def test_most_below_base_is_refused() -> None:
    with pytest.raises(ValueError, match="most"):
        ThreadGovernor(2, 1)


def test_max_threads_below_threads_is_a_settings_error(test_model_path: Path) -> None:
    with pytest.raises(ValueError, match="--max-threads >= --threads"):
        InferenceSettings(model=str(test_model_path), threads=2, max_threads=1)
    assert InferenceSettings(model=str(test_model_path), threads=1, max_threads=2).max_threads == 2


def test_the_machines_busy_time_counts_another_process() -> None:
    """The real /proc/stat reading: a busy child adds about its CPU time to the machine's."""
    before, wall = machine_busy_seconds(), time.monotonic()
    child = subprocess.run(
        [sys.executable, "-c", "import time\nend = time.process_time() + 0.5\n"
         "while time.process_time() < end: pass"], check=True,
    )  # fmt: skip
    assert child.returncode == 0
    busy = machine_busy_seconds() - before
    assert busy >= 0.4  # the child's 0.5 s, give or take a tick
    assert busy <= (time.monotonic() - wall) * (os.cpu_count() or 1) + 0.05


def test_niced_time_counts_as_idle_unless_this_process_is_niced_too(tmp_path: Path) -> None:
    """A nice-19 background job yields its core at once: the server may take it."""
    stat = tmp_path / "stat"
    tick = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal
    stat.write_text(f"cpu  {2 * tick} {5 * tick} {tick} {9 * tick} 0 0 0 0 0 0\ncpu0 ...\n")
    assert machine_busy_seconds(stat, niced_yield=True) == pytest.approx(3.0)
    assert machine_busy_seconds(stat, niced_yield=False) == pytest.approx(8.0)


def test_a_niced_busy_child_leaves_the_machine_idle_for_the_governor() -> None:
    """The real /proc/stat: a nice-19 child's CPU time is not counted as another's load."""
    spin = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
    before = machine_busy_seconds(niced_yield=True)
    niced_before = machine_busy_seconds(niced_yield=False)
    subprocess.run(["nice", "-n", "19", sys.executable, "-c", spin], check=True)
    counted = machine_busy_seconds(niced_yield=True) - before
    all_busy = machine_busy_seconds(niced_yield=False) - niced_before
    # the child's 1.0 s went to "nice" (a VM may book part of it as stolen: at least a tenth)
    assert all_busy - counted >= 0.1
