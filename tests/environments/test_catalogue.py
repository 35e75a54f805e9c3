"""The catalogue as a whole: reward doctests and registry, complete folders, valid configs."""

from __future__ import annotations

import doctest
import importlib

import pytest
from envcat_testlib import ENVIRONMENTS, load_env_module

MODULES = [
    "atroposlib.envs.reward_fns.registry",
    "atroposlib.envs.reward_fns.answers",
    "atroposlib.envs.reward_fns.math_rewards",
    "atroposlib.envs.reward_fns.format_rewards",
    "atroposlib.envs.reward_fns.code_rewards",
    "atroposlib.envs.reward_fns.tool_call_rewards",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


ENV_FOLDERS = sorted(p.parent.name for p in ENVIRONMENTS.glob("*/env.py"))
WITH_DOCTESTS = {"addition", "blackjack", "code_game", "letter_counting", "openai_agent",
                 "reasoning_gym", "rlaif", "sft_loader", "tictactoe"}  # fmt: skip


def test_every_environment_folder_has_env_readme_and_config() -> None:
    assert len(ENV_FOLDERS) >= 12
    for name in ENV_FOLDERS:
        folder = ENVIRONMENTS / name
        assert (folder / "README.md").is_file(), name
        assert (folder / "config.yaml").is_file(), name


@pytest.mark.parametrize("name", ENV_FOLDERS)
def test_environment_doctests(name: str) -> None:
    result = doctest.testmod(
        load_env_module(name), optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS
    )
    assert result.failed == 0
    assert (result.attempted > 0) is (name in WITH_DOCTESTS)


def test_catalogue_rewards_are_registered_and_score_chats() -> None:
    from atroposlib.envs.reward_fns import get_reward, list_rewards

    names = {"gsm8k", "boxed_math", "answer_tag_format", "answer_tag_partial_format",
             "code_execution", "test_pass_rate", "tool_call_match"}  # fmt: skip
    assert names <= set(list_rewards())
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "\\boxed{4}"}]
    assert get_reward("gsm8k")([chat, "\\boxed{5}"], answer=["#### 4"] * 2) == [1.0, 0.0]
    assert get_reward("boxed_math")([chat], answer=["4"]) == [1.0]
    tagged = [{"role": "assistant", "content": "<answer>4</answer>"}]
    assert get_reward("answer_tag_format")([tagged, chat]) == [1.0, 0.0]
    assert get_reward("answer_tag_partial_format")([tagged, chat]) == [1.0, 0.0]


@pytest.mark.parametrize("name", ENV_FOLDERS)
def test_config_yaml_parses_into_the_env_settings(name: str) -> None:
    from atroposlib.envs.base import BaseEnv
    from atroposlib.envs.cli import parse_settings

    module = load_env_module(name)
    (env_cls,) = [
        value for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, BaseEnv) and value is not BaseEnv
    ]  # fmt: skip
    settings = parse_settings(
        env_cls, "serve", ["--config", str(ENVIRONMENTS / name / "config.yaml")]
    )
    assert isinstance(settings.env, env_cls.env_config_cls)
    assert settings.env.tokenizer_name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert settings.openai is not None and settings.openai.base_url == "http://localhost:9001/v1"
