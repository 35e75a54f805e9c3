"""``parse_command_line``: the one parser of every command (flags, variables, help, errors)."""

from __future__ import annotations

from pathlib import Path

import pytest

from atroposlib.cli.jsonl2html import Jsonl2HtmlSettings
from atroposlib.cli.slurm_plan import SlurmPlanSettings
from atroposlib.cli.view_run import ViewRunSettings
from atroposlib.export.settings import SftSettings
from atroposlib.utils.cli import parse_command_line


@pytest.mark.parametrize(
    ("argv", "variables", "expected"),
    [
        ([], {}, None),
        ([], {"ATROPOS_API_KEY": "shared"}, "shared"),
        ([], {"ATROPOS_API_KEY": "shared", "ATROPOS_VIEW_API_KEY": "own"}, "own"),
        (["--api-key", "flag"], {"ATROPOS_API_KEY": "shared", "ATROPOS_VIEW_API_KEY": "own"},
         "flag"),
    ],
)  # fmt: skip
def test_api_key_flag_then_own_variable_then_the_shared_key(
    argv: list[str],
    variables: dict[str, str],
    expected: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("ATROPOS_API_KEY", "ATROPOS_VIEW_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert parse_command_line(ViewRunSettings, argv, "view-run").api_key == expected


@pytest.mark.parametrize(
    ("variables", "sft_key", "view_key"),
    [
        ({"ATROPOS_API_KEY": "run"}, "run", "run"),
        ({"ATROPOS_API_KEY": "run", "ATROPOS_ADMIN_API_KEY": "admin"}, "admin", "run"),
        ({"ATROPOS_ADMIN_API_KEY": "admin"}, "admin", None),
        ({"ATROPOS_ADMIN_API_KEY": "admin", "ATROPOS_EXPORT_API_KEY": "own"}, "own", None),
    ],
)
def test_exporters_take_batches_with_the_admin_key_the_viewer_reads_with_the_run_key(
    variables: dict[str, str],
    sft_key: str,
    view_key: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Taking batches is the broker's admin route; the viewer's /recent_groups is not."""
    for name in ("ATROPOS_API_KEY", "ATROPOS_ADMIN_API_KEY", "ATROPOS_EXPORT_API_KEY",
                 "ATROPOS_VIEW_API_KEY"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    sft = parse_command_line(SftSettings, ["out.jsonl", "--save-messages"], "atropos-sft-gen")
    assert sft.api_key == sft_key
    assert parse_command_line(ViewRunSettings, [], "view-run").api_key == view_key


def test_command_line_only_settings_read_no_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("port", "PORT", "format", "tp"):
        monkeypatch.setenv(name, "9")
    args = parse_command_line(SlurmPlanSettings, ["--tp", "2"], "slurm_plan")
    assert (args.tp, args.port, args.format) == ("2", None, "urls")


def test_positionals_switches_and_repeated_lists() -> None:
    argv = ["--save-messages", "out.jsonl", "--input", "a.jsonl", "--input", "-", "--quiet"]
    settings = parse_command_line(SftSettings, argv, "atropos-sft-gen")
    assert settings.filepath == Path("out.jsonl")
    assert settings.input == ["a.jsonl", "-"]
    assert settings.save_messages and settings.quiet
    pages = parse_command_line(Jsonl2HtmlSettings, ["in.jsonl", "out.html"], "jsonl2html")
    assert (pages.input_path, pages.output_path) == (Path("in.jsonl"), Path("out.html"))


def test_help_names_positionals_by_field_and_shows_no_default_for_a_switch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stop:
        parse_command_line(SftSettings, ["--help"], "atropos-sft-gen", description="Write SFT.")
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: atropos-sft-gen ") and "Write SFT." in out
    assert "\n  filepath " in out and "FILEPATH" not in out
    quiet = out[out.index("\n  --quiet") :].split("\n  --")[1]
    assert "default" not in quiet and "--no-quiet" not in out


def test_a_bad_choice_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parse_command_line(SlurmPlanSettings, ["--format", "xml"], "slurm_plan")
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "slurm_plan: error: --format: invalid choice 'xml' "
        "(choose from 'urls', 'table', 'trainer-urls' or 'json')\n"
    )
