"""atropos-local's token budget comes from the env config when nothing else sets it: a task
whose prompts carry worked examples states ``env.max_token_length`` once; the flag and
``ATROPOS_LOCAL_MAX_TOKEN_LEN`` still win; a budget that cannot work stops the command in one
line before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.errors import ConfigError
from atroposlib.localrun import components
from atroposlib.localrun.components import RunLayout
from atroposlib.localrun.keys import RunKeys
from atroposlib.localrun.settings import LocalRunSettings, take_env_config_budget


def env_config(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "env.yaml"
    path.write_text(f"env:\n  max_completion_tokens: 64\n{extra}")
    return path


def test_the_env_configs_budget_reaches_the_env_and_the_trainer(tmp_path: Path) -> None:
    settings = LocalRunSettings(env_config=env_config(tmp_path, "  max_token_length: 384\n"))
    take_env_config_budget(settings)
    layout = RunLayout(tmp_path, "/models/smol", 1, 2)
    trainer = components.trainer(layout, settings, RunKeys(run="run-key", admin="admin-key"))
    env = components.environment(layout, settings)
    assert trainer.argv[trainer.argv.index("--max-token-len") + 1] == "384"
    assert env.argv[env.argv.index("--env.max_token_length") + 1] == "384"


def test_without_one_in_the_config_the_default_stays(tmp_path: Path) -> None:
    settings = LocalRunSettings(env_config=env_config(tmp_path))
    take_env_config_budget(settings)
    assert settings.max_token_len == LocalRunSettings.model_fields["max_token_len"].default


def test_the_flag_and_the_environment_variable_win_over_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = env_config(tmp_path, "  max_token_length: 384\n")
    settings = LocalRunSettings(env_config=config, max_token_len=300)
    take_env_config_budget(settings)
    assert settings.max_token_len == 300
    monkeypatch.setenv("ATROPOS_LOCAL_MAX_TOKEN_LEN", "320")
    settings = LocalRunSettings(env_config=config)
    take_env_config_budget(settings)
    assert settings.max_token_len == 320


@pytest.mark.parametrize("value", ["lots", "8", "true", "[384]"])
def test_a_budget_that_cannot_work_names_the_file_and_the_fix(tmp_path: Path, value: str) -> None:
    settings = LocalRunSettings(env_config=env_config(tmp_path, f"  max_token_length: {value}\n"))
    with pytest.raises(ConfigError, match=r"env\.yaml: env\.max_token_length is .*--max-token-len"):
        take_env_config_budget(settings)
    assert settings.max_token_len == LocalRunSettings.model_fields["max_token_len"].default


def test_atropos_local_refuses_it_in_one_line_before_starting_anything(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    config = env_config(tmp_path, "  max_token_length: lots\n")
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.local", "--env-config", str(config),
         "--run-dir", str(run_dir)],
        capture_output=True, text=True, env=subprocess_env, timeout=120,
    )  # fmt: skip
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "env.max_token_length is 'lots'" in lines[0], result.stderr
    assert not run_dir.exists()


def test_a_config_that_is_not_yaml_is_refused_and_one_without_env_keeps_the_default(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml: not valid YAML"):
        take_env_config_budget(LocalRunSettings(env_config=broken))
    listed = tmp_path / "listed.yaml"
    listed.write_text("- env\n")
    settings = LocalRunSettings(env_config=listed)
    take_env_config_budget(settings)
    assert settings.max_token_len == LocalRunSettings.model_fields["max_token_len"].default
