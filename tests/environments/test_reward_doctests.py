"""Every reward module's doctests run as part of the suite (STYLE habit 7)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "atroposlib.envs.reward_fns.answers",
    "atroposlib.envs.reward_fns.math_rewards",
    "atroposlib.envs.reward_fns.format_rewards",
    "atroposlib.envs.reward_fns.code_rewards",
    "atroposlib.envs.reward_fns.tool_call_rewards",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
