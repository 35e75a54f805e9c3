"""The test run's own scheduling (tests/xdist_order.py): xdist hands out the longest test files
first, and a worker gets its next file only on the last test of its current one. Driven with
stand-in workers: what is checked is the scheduler's decisions, in a simulated run whose
clock advances by each test's given seconds."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from xdist.scheduler import LoadFileScheduling

from tests.xdist_order import DurationRecorder, LongestFileFirst, longest_first


@dataclass(eq=False)
class Worker:
    name: str
    queue: list[int] = field(default_factory=list)
    shutting_down: bool = False
    gateway: Any = None

    def __post_init__(self) -> None:
        self.gateway = SimpleNamespace(id=self.name)

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.queue.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


class Quiet:
    """A scheduler log that prints nothing (xdist's default one writes to stdout)."""

    def __getattr__(self, name: str) -> Quiet:
        return self

    def __call__(self, *args: object) -> None:
        return None


def scheduler(
    collection: list[str], durations: dict[str, float], workers: int, stock: bool = False
) -> Any:
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"],
                             option=SimpleNamespace(loadscopereorder=True))  # fmt: skip
    if stock:
        sched = LoadFileScheduling(config, Quiet())
    else:
        sched = LongestFileFirst(config, Quiet(), durations=durations)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
    for node in nodes:
        sched.add_node_collection(node, collection)
    sched.schedule()
    return sched, nodes


def simulate(
    collection: list[str], seconds: dict[str, float], workers: int = 2, stock: bool = False
) -> Any:
    """Run the schedule to its end, completions in time order: each worker runs its queue in
    order (a test only once a next one is queued or it is shutting down, as xdist's workers
    do). Returns the finishing time and each worker's files in the order it started them."""
    durations: dict[str, float] = {}
    for nodeid, s in seconds.items():
        name = nodeid.split("::")[0]
        durations[name] = durations.get(name, 0.0) + s
    sched, nodes = scheduler(collection, durations, workers, stock)
    now = 0.0
    running: dict[str, tuple[float, int]] = {}  # worker -> (ends at, test index)
    started: dict[str, list[str]] = {node.name: [] for node in nodes}
    while True:
        for node in nodes:
            can_start = len(node.queue) >= 2 or (node.queue and node.shutting_down)
            if node.name not in running and can_start:
                index = node.queue.pop(0)
                name = collection[index].split("::")[0]
                if not started[node.name] or started[node.name][-1] != name:
                    started[node.name].append(name)
                running[node.name] = (now + seconds[collection[index]], index)
        if not running:
            break
        name = min(running, key=lambda n: running[n][0])
        now, index = running.pop(name)
        sched.mark_test_complete(next(n for n in nodes if n.name == name), index)
    assert sched.tests_finished
    return now, started


COLLECTION = [f"tests/test_many.py::test_{i}" for i in range(12)] + [
    "tests/test_two.py::test_a", "tests/test_two.py::test_b",
    "tests/test_loop.py::test_whole_loop", "tests/test_mid.py::test_one",
    *(f"tests/test_small_{i}.py::test_it" for i in range(6)),
]  # fmt: skip
SECONDS = {nodeid: 1.0 for nodeid in COLLECTION} | {
    "tests/test_loop.py::test_whole_loop": 200.0, "tests/test_mid.py::test_one": 90.0,
    "tests/test_two.py::test_b": 80.0,
}  # fmt: skip


def test_the_longest_files_go_first_and_the_run_ends_sooner_than_by_test_count() -> None:
    finish, started = simulate(COLLECTION, SECONDS)
    assert started["gw0"][:2] == ["tests/test_loop.py", "tests/test_small_5.py"]
    assert started["gw1"][:2] == ["tests/test_mid.py", "tests/test_small_4.py"]
    # 389 s of work on two workers: 195 s at best, and the 200 s test bounds it below
    assert finish == 201.0
    stock_finish, stock_started = simulate(COLLECTION, SECONDS, stock=True)
    assert stock_started["gw0"][0] == "tests/test_many.py"  # xdist's order: most tests first
    assert stock_finish >= 280.0


def test_a_worker_is_given_its_next_file_only_on_its_last_test() -> None:
    durations = {"tests/test_many.py": 90.0, "tests/test_two.py": 80.0,
                 "tests/test_loop.py": 70.0, "tests/test_mid.py": 60.0}  # fmt: skip
    collection = COLLECTION[:16]  # without the small files
    sched, (one, two) = scheduler(collection, durations, workers=2)
    assert [collection[i].split("::")[0] for i in one.queue] == ["tests/test_many.py"] * 12
    assert [collection[i].split("::")[0] for i in two.queue] == ["tests/test_two.py"] * 2
    assert list(sched.workqueue) == ["tests/test_loop.py", "tests/test_mid.py"]
    for index in one.queue[:10]:
        sched.mark_test_complete(one, index)
    assert len(sched.workqueue) == 2  # two tests of test_many still pending on one
    sched.mark_test_complete(one, one.queue[10])
    assert list(sched.workqueue) == ["tests/test_mid.py"]  # on its last test: the next file
    assert collection[one.queue[-1]] == "tests/test_loop.py::test_whole_loop"


def test_files_without_a_figure_are_queued_as_medium_ones() -> None:
    scopes = {"new.py": {}, "long.py": {}, "short.py": {}}
    order = list(longest_first(scopes, {"long.py": 500.0, "short.py": 2.0}))
    assert order == ["long.py", "new.py", "short.py"]


def test_more_workers_than_files_shuts_the_idle_ones_down() -> None:
    collection = ["tests/test_only.py::test_a", "tests/test_only.py::test_b"]
    _, nodes = scheduler(collection, {}, workers=2)
    assert sorted(len(n.queue) for n in nodes) == [0, 2]
    assert [n.shutting_down for n in nodes if not n.queue] == [True]


def test_the_recorder_updates_the_files_it_ran_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests/test_kept.py": 7.0, "tests/test_ran.py": 100.0}))
    recorder = DurationRecorder(path)
    for when, seconds in (("setup", 1.25), ("call", 3.0), ("teardown", 0.5)):
        report = SimpleNamespace(nodeid="tests/test_ran.py::test_x", when=when, duration=seconds)
        recorder.pytest_runtest_logreport(report)
    recorder.pytest_sessionfinish()
    assert json.loads(path.read_text()) == {"tests/test_kept.py": 7.0, "tests/test_ran.py": 4.8}
