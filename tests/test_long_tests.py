"""Tests over five minutes are named in every run's summary, with the reason beside them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.long_tests import REASON_NEEDED_S, REASON_PROPERTY, long_tests, reason_of, summary_lines


def report(nodeid: str, when: str, seconds: float, reason: str | None = None) -> Any:
    properties = [("tier", "vllm")] + ([(REASON_PROPERTY, reason)] if reason else [])
    return SimpleNamespace(nodeid=nodeid, when=when, duration=seconds, user_properties=properties)


def item(*args: object, **kwargs: object) -> Any:
    marker = SimpleNamespace(args=args, kwargs=kwargs)
    return SimpleNamespace(nodeid="tests/x.py::t", get_closest_marker=lambda name: marker)


def test_setup_call_and_teardown_add_up_and_the_longest_comes_first() -> None:
    reports = [
        report("a.py::server_start_in_setup", "setup", 250.0, "two compiled starts"),
        report("a.py::server_start_in_setup", "call", 60.0, "two compiled starts"),
        report("a.py::server_start_in_setup", "teardown", 1.0, "two compiled starts"),
        report("b.py::longest", "call", 400.0),
        report("c.py::short", "call", 299.0),
        SimpleNamespace(nodeid="c.py"),  # a collection report has no phase
    ]
    found = long_tests(reports)
    assert [(t.nodeid, round(t.seconds), t.reason) for t in found] == [
        ("b.py::longest", 400, None),
        ("a.py::server_start_in_setup", 311, "two compiled starts"),
    ]
    lines = summary_lines(found)
    assert lines[0] == f"tests over {REASON_NEEDED_S:.0f} s: 2"
    assert "b.py::longest (no reason given" in lines[1]
    assert lines[2].endswith("a.py::server_start_in_setup (two compiled starts)")


def test_a_run_without_long_tests_says_so() -> None:
    assert summary_lines(long_tests([report("a.py::t", "call", 12.0)])) == ["tests over 300 s: 0"]


def test_the_reason_is_read_from_the_mark_and_an_empty_one_is_refused() -> None:
    assert reason_of(item("a whole loop on vLLM")) == "a whole loop on vLLM"
    assert reason_of(item(reason="two starts")) == "two starts"
    assert reason_of(SimpleNamespace(get_closest_marker=lambda name: None)) is None
    for bad in (item(), item("  "), item(300)):
        with pytest.raises(pytest.UsageError, match="needs the reason as text"):
            reason_of(bad)
