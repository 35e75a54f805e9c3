"""Code execution: the model writes Python, the sandbox runs it, the outcome is the reward.

``mode: execution`` scores how the program ended: +1.0 ran with output, +0.5 ran silently,
-0.5 syntax or indentation error, -1.0 runtime error, timeout, memory or output limit.
``mode: tests`` runs MBPP-style problems (``text``, ``test_list``): the score is the pass rate on
the asserts, or the negative execution reward when the program cannot run at all.
"""

import asyncio
import json
import random
from pathlib import Path
from typing import Literal

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.reward_fns.code_rewards import execution_reward, extract_python_code
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.group import ScoredData
from atroposlib.sandbox import SandboxLimits, SandboxResult, arun_python
from atroposlib.type_definitions import Item

HERE = Path(__file__).resolve().parent
SYSTEM_PROMPT = "You write Python. Reply with one ```python code block and nothing else."


class CodeExecutionConfig(BaseEnvConfig):
    mode: Literal["execution", "tests"] = Field(
        default="execution", description="execution: score how it ran; tests: assert pass rate."
    )
    data_path: str | None = Field(
        default=None,
        description="JSONL of tasks ({prompt}) or MBPP rows; None: tasks.jsonl or the hub's mbpp.",
    )
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits, description="Sandbox limits.")
    max_completion_tokens: int = Field(default=512, ge=1, description="Tokens per answer.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")


def load_rows(config: CodeExecutionConfig) -> list[dict]:
    if config.data_path is None and config.mode == "tests":
        from datasets import load_dataset

        return list(load_dataset("google-research-datasets/mbpp", "full", split="train"))
    path = Path(config.data_path or HERE / "tasks.jsonl")
    path = path if path.exists() else HERE / path
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def task_prompt(row: dict) -> str:
    if "test_list" not in row:
        return row["prompt"]
    tests = "\n".join(row["test_list"])
    return f"{row['text']}\nYour code should pass these tests:\n{tests}"


def score_run(result: SandboxResult, mode: str) -> float:
    """The reward of one sandboxed run (see the module docstring)."""
    if mode == "tests" and result.ok:
        return result.pass_rate
    return execution_reward(result)


class CodeExecutionEnv(BaseEnv):
    name = "code_execution"
    env_config_cls = CodeExecutionConfig

    @classmethod
    def config_init(cls) -> tuple[CodeExecutionConfig, list[APIServerConfig]]:
        config = CodeExecutionConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=8,
            max_token_length=1024,
            total_steps=500,
            steps_per_eval=0,
        )
        return config, [
            APIServerConfig(
                model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
            )
        ]

    async def setup(self) -> None:
        self.rows = load_rows(self.config)
        random.Random(0).shuffle(self.rows)
        self.index = 0

    async def get_next_item(self) -> Item:
        row = self.rows[self.index % len(self.rows)]
        self.index += 1
        return row

    async def run_code(self, reply: str, row: dict) -> SandboxResult:
        code = extract_python_code(reply)
        if self.config.mode == "tests":
            code = f"{row.get('test_setup_code') or ''}\n{code}"
            return await arun_python(code, tests=row["test_list"], limits=self.config.sandbox)
        return await arun_python(code, limits=self.config.sandbox)

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        chat = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task_prompt(item)},
        ]
        sampler = self.token_sampler()
        replies = await sampler.sample(sampler.start(chat), n=self.config.group_size)
        results = await asyncio.gather(*(self.run_code(r.reply, item) for r in replies))
        group = sampler.group(
            replies,
            [score_run(result, self.config.mode) for result in results],
            extra=[{"sandbox_status": result.status.value} for result in results],
        )
        return group, []


if __name__ == "__main__":
    CodeExecutionEnv.cli()
