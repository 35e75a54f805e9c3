"""Atropos 0.4.0's own HTTP tests (shipped in its wheel on PyPI) against our broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scripts import atropos_own_tests as runner

REPO = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="overlay.tests.test_api_legacy" name="test_register" time="0.1"/>
<testcase classname="overlay.tests.test_api_messages_handling.TestSFTIntegration"
  name="test_sft_batch_processing" time="0.1"><failure message="assert 422 == 200">x</failure>
</testcase>
<testcase classname="" name="overlay.tests.test_utils.test_heterogeneous_packing" time="0">
  <error message="collection failure">ImportError</error></testcase>
<testcase classname="overlay.tests.test_x" name="test_y" time="0">
  <skipped message="need --run-gpu option to run"/></testcase>
</testsuite></testsuites>"""


def test_the_report_reads_each_outcome_and_only_the_listed_exceptions_are_expected(
    tmp_path: Path,
) -> None:
    tests = tmp_path / "tests"
    (tests / "test_utils").mkdir(parents=True)
    for name in ("test_api_legacy", "test_api_messages_handling", "test_x",
                 "test_utils/test_heterogeneous_packing"):  # fmt: skip
        (tests / f"{name}.py").write_text("")
    report = tmp_path / "report.xml"
    report.write_text(JUNIT)
    rows = runner.outcomes(report, tests)
    assert [(r["test"], r["outcome"]) for r in rows] == [
        ("test_api_legacy.py::test_register", "passed"),
        ("test_api_messages_handling.py::TestSFTIntegration::test_sft_batch_processing", "failed"),
        ("test_utils/test_heterogeneous_packing.py::(import)", "error"),
        ("test_x.py::test_y", "skipped"),
    ]
    assert [r["test"] for r in runner.unexpected(rows)] == [
        "test_utils/test_heterogeneous_packing.py::(import)",
        "test_x.py::test_y",
    ]


def test_files_whose_tests_skipped_for_want_of_vllm_are_rerun_and_their_rows_replaced() -> None:
    def row(test: str, outcome: str = "passed", reason: str = "") -> dict[str, str]:
        return {"test": test, "outcome": outcome, "reason": reason}

    first = [
        row("test_api_legacy.py::test_register"),
        row("test_managed_server.py::test_plain"),
        row("test_managed_server.py::test_tool_call_parsing_outbound", "skipped",
            "vLLM not installed"),
        row("test_vllm_api_server_generate.py::test_generate", "skipped",
            "could not import 'vllm': No module named 'vllm'"),
        row("test_x.py::test_gpu", "skipped", "need --run-gpu option to run"),
    ]  # fmt: skip
    files = runner.files_wanting_vllm(first)
    assert files == ["test_managed_server.py", "test_vllm_api_server_generate.py"]
    # without a vLLM pass, those skips are not counted against us; other skips still are
    assert [r["test"] for r in runner.unexpected(first, vllm_ran=False)] == ["test_x.py::test_gpu"]
    assert len(runner.unexpected(first, vllm_ran=True)) == 3

    second = [
        row("test_managed_server.py::test_plain"),
        row("test_managed_server.py::test_tool_call_parsing_outbound"),
        row("test_vllm_api_server_generate.py::test_generate", "failed", "assert 500 == 200"),
    ]
    merged = runner.merge_vllm_pass(first, second, files)
    assert [(r["test"], r["outcome"], r.get("with")) for r in merged] == [
        ("test_api_legacy.py::test_register", "passed", None),
        ("test_managed_server.py::test_plain", "passed", "vllm"),
        ("test_managed_server.py::test_tool_call_parsing_outbound", "passed", "vllm"),
        ("test_vllm_api_server_generate.py::test_generate", "failed", "vllm"),
        ("test_x.py::test_gpu", "skipped", None),
    ]
    lines = runner.table({"source": "atropos", "vllm": "vLLM 0.32.0", "tests": merged,
                          "counts": runner.summary(merged)})  # fmt: skip
    assert "The 3 tests marked *vLLM 0.32.0* are those of the 2 files" in lines[2]
    assert "| `test_managed_server.py::test_plain` | passed (vLLM 0.32.0) |  |" in lines
    assert "| `test_api_legacy.py::test_register` | passed |  |" in lines


@pytest.mark.slow
def test_atropos_0_4_0_http_tests_pass_except_the_two_deliberate_422s() -> None:
    """The wheel is downloaded at test time (a test dependency), never kept in the repo."""
    done = subprocess.run(
        [sys.executable, "scripts/atropos_own_tests.py", "--wheel", "0.4.0",
         "--only", "test_api_*"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    summary = [line for line in done.stdout.splitlines() if "Atropos's own tests" in line]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert summary and "2 failed" in summary[0] and "0 not as expected" in summary[0], summary
    passed = int(summary[0].split(" passed")[0].rsplit(" ", 1)[-1])
    assert passed >= 30, summary
