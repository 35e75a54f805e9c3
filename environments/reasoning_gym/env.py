"""Reasoning Gym: any of its procedural tasks (or a weighted mix), scored by its own scorers.

Fully offline. Replies answer inside ``<answer>…</answer>``; the score is the task's own
``score_answer`` plus ``format_weight`` for a well-formed reply. Difficulty settings go to each
task's generator through ``task_configs`` (e.g. ``{"basic_arithmetic": {"max_digits": 2}}``).
Run: ``python environments/reasoning_gym/env.py process --config <folder>/config.yaml``
"""

import asyncio
import difflib
import random
import time
from typing import Any

import reasoning_gym
from pydantic import Field, field_validator
from reasoning_gym.factory import DATASETS

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.reward_fns.answers import extract_answer_tag, extract_final_number
from atroposlib.envs.reward_fns.format_rewards import answer_tag_format_reward
from atroposlib.envs.rollouts import greedy_reply, sample_group
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

SYSTEM_PROMPT = "Reply with the final answer inside <answer></answer>."


class ReasoningGymConfig(BaseEnvConfig):
    tasks: dict[str, float] = Field(
        default={"basic_arithmetic": 1.0}, description="Task names and their sampling weights."
    )
    task_configs: dict[str, dict[str, Any]] = Field(
        default={},
        description="Per-task generator settings (difficulty), passed to create_dataset.",
    )
    dataset_size: int = Field(default=10_000, ge=1, description="Training entries per task.")
    eval_size: int = Field(default=50, ge=1, description="Evaluation entries per task.")
    seed: int = Field(default=0, description="Seed of the training data; eval uses seed + 1.")
    format_weight: float = Field(default=0.2, ge=0, description="Added for a well-formed reply.")
    max_completion_tokens: int = Field(default=256, ge=1, description="Tokens per answer.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    lenient_answers: bool = Field(
        default=False,
        description="Without an <answer> tag, grade the reply's final number instead of 0 "
        "(for small models that do not follow the format yet; the tag still earns the "
        "format reward).",
    )

    @field_validator("tasks")
    @classmethod
    def known_tasks(cls, tasks: dict[str, float]) -> dict[str, float]:
        for name, weight in tasks.items():
            if name not in DATASETS:
                close = difflib.get_close_matches(name, DATASETS, n=3) or ["basic_arithmetic"]
                raise ValueError(f"unknown reasoning-gym task {name!r}; did you mean {close}?")
            if weight <= 0:
                raise ValueError(f"task {name!r} has weight {weight}: weights must be > 0")
        if not tasks:
            raise ValueError("no tasks: give at least one, e.g. {basic_arithmetic: 1.0}")
        return tasks


def grade(reply: str, entry: dict, dataset: Any, lenient: bool = False) -> float:
    """The task's own score of the ``<answer>`` content (or, if lenient, the final number)."""
    answer = extract_answer_tag(reply)
    if answer is None and lenient:
        answer = extract_final_number(reply)
    return float(dataset.score_answer(answer, entry)) if answer is not None else 0.0


def score_reply(
    reply: str, entry: dict, dataset: Any, format_weight: float, lenient: bool = False
) -> float:
    """Correctness plus the format component."""
    correct = grade(reply, entry, dataset, lenient)
    return correct + format_weight * answer_tag_format_reward([reply])[0]


class ReasoningGymEnv(BaseEnv):
    name = "reasoning_gym"
    env_config_cls = ReasoningGymConfig

    @classmethod
    def config_init(cls) -> tuple[ReasoningGymConfig, list[APIServerConfig]]:
        config = ReasoningGymConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=8,
            max_token_length=512,
            total_steps=500,
            steps_per_eval=50,
        )
        return config, [
            APIServerConfig(
                model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
            )
        ]

    def make_datasets(self, size: int, seed: int) -> dict[str, Any]:
        configs = self.config.task_configs
        return {
            name: reasoning_gym.create_dataset(name, size=size, seed=seed, **configs.get(name, {}))
            for name in self.config.tasks
        }

    async def setup(self) -> None:
        self.train = self.make_datasets(self.config.dataset_size, self.config.seed)
        self.test = self.make_datasets(self.config.eval_size, self.config.seed + 1)
        self.rng = random.Random(self.config.seed)
        self.position = dict.fromkeys(self.train, 0)

    async def get_next_item(self) -> Item:
        names, weights = zip(*self.config.tasks.items(), strict=True)
        task = self.rng.choices(names, weights=weights)[0]
        index = self.position[task] % self.config.dataset_size
        self.position[task] += 1
        return {"task": task, "entry": self.train[task][index]}

    def prompt(self, question: str) -> list[dict]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        entry, dataset = item["entry"], self.train[item["task"]]
        weight, lenient = self.config.format_weight, self.config.lenient_answers
        group = await sample_group(
            self.server,
            self.tokenizer,
            self.prompt(entry["question"]),
            lambda replies: [score_reply(r, entry, dataset, weight, lenient) for r in replies],
            n=self.config.group_size,
            max_tokens=self.config.max_completion_tokens,
            temperature=self.config.temperature,
        )
        return group, []

    async def evaluate(self, *args, **kwargs) -> None:
        started = time.time()
        pairs = [(task, entry) for task, dataset in self.test.items() for entry in dataset]
        samples = await asyncio.gather(*(self.evaluate_one(t, e) for t, e in pairs))
        metrics = {}
        for task in self.test:
            scores = [s["score"] for s in samples if s["task"] == task]
            metrics[f"eval/{task}/accuracy"] = sum(scores) / len(scores)
        metrics["eval/accuracy"] = sum(s["score"] for s in samples) / len(samples)
        await self.evaluate_log(metrics, samples=samples, start_time=started, end_time=time.time())

    async def evaluate_one(self, task: str, entry: dict) -> dict:
        """Greedy answer to one held-out problem (all of them are in flight at once)."""
        prompt = self.prompt(entry["question"])
        reply = await greedy_reply(
            self.server, prompt, max_tokens=self.config.max_completion_tokens
        )
        score = grade(reply, entry, self.test[task], self.config.lenient_answers)
        return {"task": task, "question": entry["question"], "response": reply,
                "answer": entry["answer"], "score": score}  # fmt: skip


if __name__ == "__main__":
    ReasoningGymEnv.cli()
