"""jsonl2html: the env ``process`` renderer applied to a dump file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.cli import jsonl2html
from atroposlib.utils.html_report import render_groups_html
from tests.tools.conftest import read_lines
from tests.tools.fixture_groups import GROUPS_PATH


def _run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str]:
    capsys.readouterr()
    try:
        jsonl2html.main([str(arg) for arg in argv])
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    return code, capsys.readouterr().err


def test_same_page_as_the_env_process_renderer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "groups.jsonl"
    dump.write_text(GROUPS_PATH.read_text())
    code, err = _run(capsys, dump)
    assert code == 0, err
    page = (tmp_path / "groups.html").read_text()
    assert page == render_groups_html(read_lines(GROUPS_PATH), "groups.jsonl")
    assert "Name a primary colour." in page and page.count('class="group"') == 3
    assert err.strip() == f"jsonl2html: wrote 3 groups to {tmp_path / 'groups.html'}"


def test_output_path_and_title(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    code, _ = _run(capsys, GROUPS_PATH, out, "--title", "run <12>")
    assert code == 0
    assert "<title>run &lt;12&gt;</title>" in out.read_text()


def test_bad_lines_are_skipped_with_a_warning_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "mixed.jsonl"
    first = GROUPS_PATH.read_text().splitlines()[0]
    dump.write_text(f'{first}\n{{"truncated": \n{{"no": "scores"}}\n')
    code, err = _run(capsys, dump)
    assert code == 0
    assert f"skipped {dump}:2: not JSON" in err and f"skipped {dump}:3: not a group" in err
    assert (tmp_path / "mixed.html").read_text().count('class="group"') == 1


@pytest.mark.parametrize(
    ("argv", "status", "needle"),
    [
        ([], 2, "input_path"),
        (["/nonexistent.jsonl"], 2, "no such file"),
        (["--bogus", str(GROUPS_PATH)], 2, "--bogus"),
    ],
)
def test_bad_arguments_one_line(
    argv: list[str], status: int, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, *argv)
    assert code == status
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_refuses_to_overwrite_its_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "groups.html"
    dump.write_text(GROUPS_PATH.read_text())
    code, err = _run(capsys, dump)
    assert code == 2 and "overwrite the input" in err
    assert dump.read_text() == GROUPS_PATH.read_text()


def test_empty_dump_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dump = tmp_path / "empty.jsonl"
    dump.write_text("\n")
    code, err = _run(capsys, dump)
    assert code == 1 and "no group to render" in err
    assert not (tmp_path / "empty.html").exists()


def test_console_entry_runs_as_a_process(tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    out = tmp_path / "page.html"
    done = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.jsonl2html", str(GROUPS_PATH), str(out)],
        env=subprocess_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")
