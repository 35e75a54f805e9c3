"""The doctests of the env framework modules (rewards, validation, circuit breaker, ...)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "atroposlib.envs.groups",
    "atroposlib.envs.optional_fields",
    "atroposlib.envs.stats",
    "atroposlib.envs.reward_fns.registry",
    "atroposlib.envs.reward_fns.reward_function",
    "atroposlib.envs.reward_fns.accuracy_reward",
    "atroposlib.envs.reward_fns.format_reward",
    "atroposlib.envs.reward_fns.reasoning_steps_reward",
    "atroposlib.envs.reward_fns.crossword_format_reward",
    "atroposlib.envs.reward_fns.repetition_penalty_reward",
    "atroposlib.envs.reward_fns.combined_reward",
    "atroposlib.envs.reward_fns.graded",
    "atroposlib.envs.heldout",
    "atroposlib.envs.heldout_eval",
    "atroposlib.envs.hermes",
    "atroposlib.inference.tool_calls",
    "atroposlib.envs.atropos_output",
    "atroposlib.envs.trajectory",
    "atroposlib.envs.adapters.chat",
    "atroposlib.envs.adapters.openenv_env",
    "atroposlib.envs.adapters.vf_client",
    "atroposlib.api.utils",
    "atroposlib.envs.server_handling.adaptive_semaphore",
    "atroposlib.envs.server_handling.circuit",
    "atroposlib.envs.server_handling.reasoning",
    "atroposlib.envs.server_handling.slurm",
    "atroposlib.envs.server_handling.sglang_server",
    "atroposlib.envs.settings",
    "atroposlib.envs.cli_help",
    "atroposlib.utils.advantages",
    "atroposlib.utils.bounded_json",
    "atroposlib.utils.tool_call_parser",
    "atroposlib.security.keys",
    "atroposlib.security.gate",
    "atroposlib.inference.sample_log",
    "atroposlib.utils.html_report",
    "atroposlib.frontend.jsonl2html",
    "atroposlib.utils.cli",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no doctest"
    assert result.failed == 0
