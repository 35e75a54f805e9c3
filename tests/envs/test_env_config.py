"""Settings precedence: CLI > environment variable > YAML > config_init(), and bad values."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from envs_testlib import child_env, env_command
from example_env import AdditionEnv

from atroposlib.envs.base import BaseEnvConfig, EvalHandlingEnum
from atroposlib.envs.cli import build_env, parse_settings


def write_yaml(tmp_path: Path, data: dict[str, object]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_config_init_defaults_and_atropos_field_defaults() -> None:
    settings = parse_settings(AdditionEnv, "serve", [], environ={})
    assert settings.env.group_size == 4 and settings.env.total_steps == 5
    assert settings.openai is not None and settings.openai.base_url == "http://localhost:9001/v1"
    plain = BaseEnvConfig()
    assert (plain.group_size, plain.max_num_workers, plain.max_eval_workers) == (4, -1, 16)
    assert (plain.steps_per_eval, plain.max_token_length, plain.eval_limit_ratio) == (
        100,
        2048,
        0.5,
    )
    assert plain.eval_handling is EvalHandlingEnum.STOP_TRAIN
    assert (plain.max_batches_offpolicy, plain.total_steps, plain.worker_timeout) == (3, 1000, 600)
    assert plain.rollout_server_url == "http://localhost:8000" and plain.use_wandb is True


@pytest.mark.parametrize(
    ("yaml_value", "env_value", "cli_value", "expected"),
    [
        (8, None, None, 8),  # YAML > config_init
        (None, "16", None, 16),  # env var > config_init
        (8, "16", None, 16),  # env var > YAML
        (8, None, "32", 32),  # CLI > YAML
        (None, "16", "32", 32),  # CLI > env var
        (8, "16", "32", 32),  # CLI > everything
    ],
)
def test_precedence_for_each_pair_of_sources(
    tmp_path: Path,
    yaml_value: int | None,
    env_value: str | None,
    cli_value: str | None,
    expected: int,
) -> None:
    argv: list[str] = []
    environ: dict[str, str] = {}
    if yaml_value is not None:
        argv += ["--config", write_yaml(tmp_path, {"env": {"group_size": yaml_value}})]
    if env_value is not None:
        environ["ATROPOS_ENV__GROUP_SIZE"] = env_value
    if cli_value is not None:
        argv += ["--env.group_size", cli_value]
    settings = parse_settings(AdditionEnv, "serve", argv, environ=environ)
    assert settings.env.group_size == expected
    assert settings.env.total_steps == 5, "untouched fields keep their config_init value"


def test_openai_sources_merge_field_by_field(tmp_path: Path) -> None:
    config = write_yaml(tmp_path, {"openai": {"model_name": "from-yaml", "timeout": 7}})
    environ = {"ATROPOS_OPENAI__TIMEOUT": "9"}
    argv = ["--config", config, "--openai.base_url", "http://gpu7:9000/v1"]
    settings = parse_settings(AdditionEnv, "serve", argv, environ=environ)
    assert settings.openai is not None
    assert settings.openai.model_name == "from-yaml"
    assert settings.openai.timeout == 9
    assert settings.openai.base_url == "http://gpu7:9000/v1"
    env = build_env(AdditionEnv, settings)
    assert [s.base_url for s in env.server.servers] == ["http://gpu7:9000/v1"]


def test_a_yaml_list_of_servers_with_a_flag_applied_to_each(tmp_path: Path) -> None:
    servers = [{"base_url": f"http://node{i}:9000/v1", "model_name": "m"} for i in range(3)]
    argv = ["--config", write_yaml(tmp_path, {"openai": servers}), "--openai.api_key", "k"]
    env = build_env(AdditionEnv, parse_settings(AdditionEnv, "serve", argv, environ={}))
    assert [s.base_url for s in env.server.servers] == [s["base_url"] for s in servers]
    assert {s.config.api_key for s in env.server.servers} == {"k"}
    assert env.max_num_workers == 8 * 3


def test_process_defaults_sit_between_config_init_and_user_sources(tmp_path: Path) -> None:
    settings = parse_settings(AdditionEnv, "process", ["--env.total_steps", "7"], environ={})
    assert settings.env.total_steps == 7
    plain = parse_settings(AdditionEnv, "process", [], environ={})
    assert plain.env.total_steps == 2, "as in Atropos: 2 groups, whatever config_init's run length"
    assert parse_settings(AdditionEnv, "serve", [], environ={}).env.total_steps == 5
    assert settings.env.data_path_to_save_groups == "data/addition.jsonl"
    assert settings.env.use_wandb is True and settings.env.include_messages is True
    quiet = parse_settings(AdditionEnv, "process", ["--env.use_wandb", "false"], environ={})
    assert quiet.env.use_wandb is False, "as in Atropos: on unless the CLI or YAML says off"


@pytest.mark.parametrize(
    "flags",
    [
        ["--env.use_wandb", "False", "--slurm", "false"],
        ["--env.use_wandb=false", "--no-slurm"],
        ["--no-env.use_wandb"],
    ],
)
def test_boolean_flags_accept_atropos_and_implicit_spellings(flags: list[str]) -> None:
    settings = parse_settings(AdditionEnv, "serve", ["--env.use_wandb", "true", *flags], environ={})
    assert settings.env.use_wandb is False and settings.slurm is False
    assert parse_settings(AdditionEnv, "serve", ["--testing", "True"], environ={}).testing is True


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--env.group_size", "many"],
            "--env.group_size: input should be a valid integer, got 'many'",
        ),
        (["--env.eval_handling", "SOMETIMES"], "--env.eval_handling"),
        (["--openai.timeout", "-3"], "--openai.timeout: input should be greater than 0, got '-3'"),
        (["--env.no_such_field", "1"], "unrecognized arguments: --env.no_such_field"),
        (["--config", "/nonexistent.yaml"], "--config: file /nonexistent.yaml does not exist"),
    ],
)
def test_a_bad_value_exits_2_with_one_line(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(AdditionEnv, "serve", flags, environ={})
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and expected in err, err


def test_help_lists_every_field_with_its_description() -> None:
    result = subprocess.run(
        env_command("serve", "--help"), env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    for name, field in BaseEnvConfig.model_fields.items():
        assert f"--env.{name}" in result.stdout
        first_words = " ".join((field.description or "").split()[:3])
        assert first_words in " ".join(result.stdout.split()), name
    assert "--openai.base_url" in result.stdout and "--slurm" in result.stdout


def test_an_unknown_command_exits_2() -> None:
    result = subprocess.run(
        env_command("serve-forever"), env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: unknown command 'serve-forever'; use one of: serve, process, evaluate"
    ]
