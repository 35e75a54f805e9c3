"""The order in which pytest-xdist hands test files to its workers: the longest first.

xdist's ``--dist loadfile`` queues the files by how many tests each holds, so a file with one
ten-minute test (a whole loop on vLLM) goes last and one worker runs it alone while the other
has finished: the run's tail. Here the queue is ordered by each file's measured seconds
(``tests/durations.json``, the longest processing time first); a worker is given its next
file only once it is on the last test of its current one, and if that test is a long one, the
shortest file waiting (xdist's workers start their last test only once they hold another), so
no long file waits on a busy worker while the other one idles.

``ATROPOS_RECORD_DURATIONS=tests/durations.json scripts/test --all`` updates the figures of
the files it ran (seconds of setup, call and teardown, as measured under CI's two workers). A
file it does not know is given ``UNKNOWN_FILE_S``: new files are queued among the medium ones.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadFileScheduling

DURATIONS_PATH = Path(__file__).with_name("durations.json")
UNKNOWN_FILE_S = 60.0
LONG_TEST_S = 30.0
"""A worker about to run a test this long (its file's seconds per test) is handed the
shortest file waiting rather than the longest: it will start it only when that test ends."""
RECORD_ENV = "ATROPOS_RECORD_DURATIONS"


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def known_durations(path: Path = DURATIONS_PATH) -> dict[str, float]:
    """File -> seconds of its last recorded run (empty when there is none)."""
    if not path.is_file():
        return {}
    return {str(name): float(seconds) for name, seconds in json.loads(path.read_text()).items()}


def longest_first(
    scopes: dict[str, dict[str, bool]], durations: dict[str, float]
) -> OrderedDict[str, dict[str, bool]]:
    """The scopes (test files) ordered by their expected seconds, the longest first; ties in
    the order they were collected."""
    ordered = sorted(scopes.items(), key=lambda item: -durations.get(item[0], UNKNOWN_FILE_S))
    return OrderedDict(ordered)


class LongestFileFirst(LoadFileScheduling):
    """``--dist loadfile`` with the queue ordered by ``longest_first``."""

    def __init__(self, config: Any, log: Any = None, durations: dict[str, float] | None = None):
        super().__init__(config, log)
        self.durations = known_durations() if durations is None else durations
        self.test_counts: dict[str, int] = {}

    def schedule(self) -> None:
        """As ``LoadScopeScheduling.schedule``, with the queue in ``longest_first`` order."""
        assert self.collection_is_completed
        if self.collection is not None:  # a node joined later
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        scopes: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            scopes.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        self.test_counts = {scope: len(tests) for scope, tests in scopes.items()}
        self.workqueue = longest_first(scopes, self.durations)
        while len(self.assigned_work) > len(self.workqueue):  # more workers than files
            idle, _ = self.assigned_work.popitem()
            idle.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:  # a worker holding one test waits for a second
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        # a worker runs its last queued test only once it knows what comes next, so one
        # pending test is the latest moment to hand it the next file
        if self._pending_of(self.assigned_work[node]) > 1:
            return
        self._assign_work_unit(node)

    def _assign_work_unit(self, node: Any) -> None:
        """The longest file waiting, unless the worker is about to start a long last test:
        then the shortest, which the other workers would otherwise finish the run on."""
        if self._long_test_pending(node):
            self.workqueue.move_to_end(next(reversed(self.workqueue)), last=False)
        super()._assign_work_unit(node)

    def _long_test_pending(self, node: Any) -> bool:
        pending = [
            scope
            for scope, tests in self.assigned_work.get(node, {}).items()
            for done in tests.values()
            if not done
        ]
        if len(pending) != 1:
            return False
        scope = pending[0]
        per_test = self.durations.get(scope, UNKNOWN_FILE_S) / max(self.test_counts[scope], 1)
        return per_test >= LONG_TEST_S


class DurationRecorder:
    """Adds up each test file's seconds (setup, call, teardown) as the controller sees its
    reports; when the run ends, updates those files' figures in ``path`` (the others kept).
    Registered on the controller only (tests/conftest.py), never in a worker."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        name = file_of(report.nodeid)
        self.seconds[name] = self.seconds.get(name, 0.0) + float(report.duration)

    def pytest_sessionfinish(self) -> None:
        if not self.seconds:
            return
        merged = known_durations(self.path)
        merged.update({name: round(seconds, 1) for name, seconds in self.seconds.items()})
        self.path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
