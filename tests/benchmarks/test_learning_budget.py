"""Every benchmark task fits the token budget ours trains it with: its longest prompt (chat
template of the test model) plus its reply budget is at most the ``max_token_len`` atropos-local
takes from the task's env config. A longer sequence is never sent, so a task over it trains on
nothing (the family task did: 254-token prompts, 64-token replies, a 256 budget)."""

from __future__ import annotations

from pathlib import Path

import pytest

from atroposlib.localrun.settings import LocalRunSettings, take_env_config_budget
from benchmarks.learning_systems import TASKS, Task

TRAINING_PROMPTS = 2000
"""Training prompts measured per seed, with every validation and test prompt."""


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_longest_prompt_and_a_full_reply_fit_the_budget_ours_runs_with(
    name: str, test_model_path: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(test_model_path))
    settings = LocalRunSettings(env_config=TASKS[name])
    take_env_config_budget(settings)
    longest = 0
    for seed in (0, 1):
        task = Task.load(TASKS[name], seed)
        for entry in [*task.train[:TRAINING_PROMPTS], *task.validation, *task.test]:
            text = tokenizer.apply_chat_template(
                task.prompt(entry), tokenize=False, add_generation_prompt=True
            )
            length = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            longest = max(longest, length)
    assert longest + task.max_tokens <= settings.max_token_len, (
        f"{name}: prompts up to {longest} tokens + {task.max_tokens} reply tokens > "
        f"max_token_len {settings.max_token_len}: set env.max_token_length in {TASKS[name]}"
    )
