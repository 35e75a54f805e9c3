"""Code execution: the model writes Python, the sandbox runs it, the outcome is the reward.

``mode: execution`` scores how the program ended: +1.0 ran with output, +0.5 ran silently,
-0.5 syntax or indentation error, -1.0 runtime error, timeout, memory or output limit.
``mode: tests`` runs MBPP-style problems (``text``, ``test_list``): the score is the pass rate on
the asserts (judged outside the program's process), or the negative execution reward when the
program cannot run at all. ``mode: io`` runs stdin/stdout tasks (``prompt``, ``io``: a list of
``{input, output}``): 1.0 when every case prints the expected output (compared here, never shown
to the sandbox), 0.0 otherwise, or the negative execution reward when the program fails.
"""

import json
import random
from pathlib import Path
from typing import Literal

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.reward_fns.code_rewards import (
    execution_reward,
    extract_python_code,
    io_reward,
    tested_functions,
)
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.group import ScoredData
from atroposlib.sandbox import SandboxLimits, SandboxResult, arun_io, arun_python
from atroposlib.sandbox.envs import check_env_sandbox, gather_runs
from atroposlib.type_definitions import Item

HERE = Path(__file__).resolve().parent
SYSTEM_PROMPT = "You write Python. Reply with one ```python code block and nothing else."


class CodeExecutionConfig(BaseEnvConfig):
    mode: Literal["execution", "tests", "io"] = Field(
        default="execution",
        description="execution: score how it ran; tests: assert pass rate; io: stdin/stdout cases.",
    )
    data_path: str | None = Field(
        default=None,
        description="JSONL of tasks ({prompt}), MBPP rows or io tasks ({prompt, io}); None: "
        "tasks.jsonl, the hub's mbpp (tests) or io_tasks.jsonl (io).",
    )
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits, description="Sandbox limits.")
    max_completion_tokens: int = Field(default=512, ge=1, description="Tokens per answer.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")


def load_rows(config: CodeExecutionConfig) -> list[dict]:
    if config.data_path is None and config.mode == "tests":
        from datasets import load_dataset

        return list(load_dataset("google-research-datasets/mbpp", "full", split="train"))
    default = "io_tasks.jsonl" if config.mode == "io" else "tasks.jsonl"
    path = Path(config.data_path or HERE / default)
    path = path if path.exists() else HERE / path
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def task_prompt(row: dict) -> str:
    if "test_list" not in row:  # execution and io tasks carry their prompt
        return row["prompt"]
    tests = "\n".join(row["test_list"])
    return f"{row['text']}\nYour code should pass these tests:\n{tests}"


def score_run(result: SandboxResult, mode: str) -> float:
    """The reward of one sandboxed run (see the module docstring)."""
    if mode == "tests" and result.ok:
        return result.pass_rate
    return execution_reward(result)


def score_runs(runs: list[SandboxResult], row: dict, mode: str) -> float:
    """The reward of one reply: its run, or in io mode its run on every case."""
    if mode == "io":
        return io_reward(runs, [case["output"] for case in row["io"]])
    return score_run(runs[0], mode)


def worst_status(runs: list[SandboxResult]) -> str:
    """The first status that is not ok (what went wrong), else ok."""
    return next((run.status.value for run in runs if not run.ok), runs[0].status.value)


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
        check_env_sandbox(self, self.config.sandbox)
        self.rows = load_rows(self.config)
        random.Random(0).shuffle(self.rows)
        self.index = 0

    async def get_next_item(self) -> Item:
        row = self.rows[self.index % len(self.rows)]
        self.index += 1
        return row

    async def run_code(self, reply: str, row: dict) -> list[SandboxResult]:
        code, limits = extract_python_code(reply), self.config.sandbox
        if self.config.mode == "io":
            return await arun_io(code, [case["input"] for case in row["io"]], limits=limits)
        if self.config.mode == "tests":
            setup, tests = row.get("test_setup_code") or "", row["test_list"]
            names = tested_functions(row.get("code") or "", tests)  # even one named like a builtin
            program = f"{setup}\n{code}"
            return [await arun_python(program, tests=tests, test_setup=setup, solution_names=names,
                                      limits=limits)]  # fmt: skip
        return [await arun_python(code, limits=limits)]

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        chat = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task_prompt(item)},
        ]
        sampler = self.token_sampler()
        replies = await sampler.sample(sampler.start(chat), n=self.config.group_size)
        results = await gather_runs(self, (self.run_code(r.reply, item) for r in replies))
        group = sampler.group(
            replies,
            [score_runs(runs, item, self.config.mode) for runs in results],
            extra=[{"sandbox_status": worst_status(runs)} for runs in results],
        )
        return group, []


if __name__ == "__main__":
    CodeExecutionEnv.cli()
