"""Tests that take over ``REASON_NEEDED_S`` on the 2-core machine carry their reason beside them
(xdist_order's ``LONG_TEST_S`` is another figure: when the scheduler hands out a short file).

A test marked ``@pytest.mark.long("why it needs the time")`` may run that long; the summary of
every run names each test over the limit (setup, call and teardown together: a module's server
start is in its first test's setup) with its reason, or says that it has none (issue 63). The
figure is read, not asserted: the machines are shared and 1.6-1.8x apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import pytest

REASON_NEEDED_S = 300.0
REASON_PROPERTY = "long_reason"


class LongTest(NamedTuple):
    nodeid: str
    seconds: float
    reason: str | None


def reason_of(item: Any) -> str | None:
    """The reason a test gives for running long; a ``long`` mark without one is a usage error."""
    marker = item.get_closest_marker("long")
    if marker is None:
        return None
    reason = marker.args[0] if marker.args else marker.kwargs.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.long needs the reason as text, "
            "e.g. @pytest.mark.long('a whole loop on vLLM: two compiled starts')"
        )
    return reason


def long_tests(reports: Iterable[Any], limit_s: float = REASON_NEEDED_S) -> list[LongTest]:
    """The tests whose phases together took over ``limit_s``, the longest first."""
    seconds: dict[str, float] = {}
    reasons: dict[str, str] = {}
    for report in reports:
        if not hasattr(report, "when"):
            continue  # collection reports
        seconds[report.nodeid] = seconds.get(report.nodeid, 0.0) + report.duration
        for key, value in report.user_properties:
            if key == REASON_PROPERTY:
                reasons[report.nodeid] = value
    found = [LongTest(node, s, reasons.get(node)) for node, s in seconds.items() if s > limit_s]
    return sorted(found, key=lambda test: -test.seconds)


def summary_lines(found: list[LongTest]) -> list[str]:
    lines = [f"tests over {REASON_NEEDED_S:.0f} s: {len(found)}"]
    for test in found:
        why = test.reason or "no reason given: mark it @pytest.mark.long('why') or make it shorter"
        lines.append(f"  {test.seconds:6.0f} s {test.nodeid} ({why})")
    return lines
