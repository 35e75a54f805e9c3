"""``--help`` of the catalogue's envs: each option's default is the one the env runs with,
marked with where it comes from, and no type or default reads as parser noise."""

from __future__ import annotations

import re
from typing import Any

import pytest
from envcat_testlib import load_env_module

from atroposlib.envs.cli import run_cli

NOISE = ("{SecretStr,null}", "<lambda>", "null (undefined)", "default factory", "(default: )")
ENV_CLASSES = {"gsm8k": "GSM8KEnv", "reasoning_gym": "ReasoningGymEnv"}


def help_text(env_cls: type[Any], command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(env_cls, [command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def option_help(text: str, flag: str) -> str:
    """The help of ``flag`` on one line (argparse wraps it)."""
    match = re.search(rf"^  {re.escape(flag)}\b(.*?)(?=^  -|^\S|\Z)", text, re.M | re.S)
    assert match is not None, f"{flag} is not in --help"
    return " ".join(match.group(1).split())


@pytest.mark.parametrize("command", ["serve", "process", "evaluate"])
@pytest.mark.parametrize("name", sorted(ENV_CLASSES))
def test_help_shows_the_env_s_own_defaults_with_their_source(
    name: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env_cls = getattr(load_env_module(name), ENV_CLASSES[name])
    text = help_text(env_cls, command, capsys)
    assert not [noise for noise in NOISE if noise in text], text
    config, servers = env_cls.config_init()
    origin = f"from {env_cls.__name__}.config_init"
    field_default = type(config).model_construct()
    overridden = [f for f in ("group_size", "tokenizer_name", "max_token_length")
                  if getattr(config, f) != getattr(field_default, f)]  # fmt: skip
    assert "group_size" in overridden and "tokenizer_name" in overridden
    for field in overridden:
        expected = f"(default: {getattr(config, field)}, {origin})"
        assert expected in option_help(text, f"--env.{field}"), field
    steps = (2, "from process") if command == "process" else (config.total_steps, origin)
    assert "(default: {}, {})".format(*steps) in option_help(text, "--env.total_steps")
    (server,) = servers
    for field in ("server_type", "base_url"):
        expected = f"(default: {getattr(server, field)}, {origin})"
        assert expected in option_help(text, f"--openai.{field}"), field
    assert "Unless given: the server of" in " ".join(text.split())
    assert "{str,null}" in option_help(text, "--env.rollout_server_api_key").split()[0]


def test_process_defaults_name_the_command_and_evaluate_its_folder(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env_cls = load_env_module("gsm8k").GSM8KEnv
    process = help_text(env_cls, "process", capsys)
    assert "(default: data/gsm8k.jsonl, from process)" in option_help(
        process, "--env.data_path_to_save_groups"
    )
    assert "(default: True, from process)" in option_help(process, "--env.include_messages")
    evaluate = help_text(env_cls, "evaluate", capsys)
    assert "(default: eval_results/gsm8k, from evaluate)" in option_help(
        evaluate, "--env.data_dir_to_save_evals"
    )
    serve = help_text(env_cls, "serve", capsys)
    assert "from serve" not in serve and "(default: null)" in option_help(
        serve, "--env.data_path_to_save_groups"
    )


def test_nested_and_factory_defaults_show_the_value_used(
    capsys: pytest.CaptureFixture[str],
) -> None:
    env_cls = load_env_module("code_game").CodeGameEnv
    text = help_text(env_cls, "serve", capsys)
    sandbox = env_cls.config_init()[0].sandbox
    assert f"(default: {sandbox.cpu_seconds})" in option_help(text, "--env.sandbox.cpu_seconds")
    assert not [noise for noise in NOISE if noise in text]
