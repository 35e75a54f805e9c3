"""run-api flags: kebab or snake case, CLI over ATROPOS_* variables over defaults."""

from __future__ import annotations

import pytest

from atroposlib.api.settings import BrokerSettings
from atroposlib.cli.run_api import parse_settings


def test_defaults_are_safe() -> None:
    settings = BrokerSettings()
    assert settings.host == "127.0.0.1" and settings.port == 8000
    assert settings.store.startswith("sqlite:") and settings.api_key is None
    assert settings.cors_origins == []


def test_cli_over_environment_over_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATROPOS_PORT", "9001")
    monkeypatch.setenv("ATROPOS_MAX_QUEUED_GROUPS", "77")
    monkeypatch.setenv("ATROPOS_API_KEY", "from-env")
    settings = parse_settings(["--max_queued_groups", "5", "--log-level", "debug"])
    assert settings.port == 9001 and settings.api_key == "from-env"
    assert settings.max_queued_groups == 5 and settings.log_level == "debug"
    assert parse_settings(["--port=9100", "--store", "memory"]).port == 9100
    assert parse_settings(["--sync-interval", "0.2"]).sync_interval == 0.2


def test_snake_case_flags_still_work_with_a_deprecation_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse_settings(["--max_queued_groups=6"]).max_queued_groups == 6
    assert "--max_queued_groups is deprecated, use --max-queued-groups" in capsys.readouterr().err
    parse_settings(["--max-queued-groups", "6"])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--port", "x"],
        ["--store", "redis:"],
        ["--too-long-policy", "truncate"],
        ["--sync-interval", "0"],
    ],
)
def test_bad_flags_exit_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        parse_settings(args)
    assert stopped.value.code == 2
    assert "error" in capsys.readouterr().err
