"""Reasoning Gym: any of its procedural tasks (or a weighted mix), scored by its own scorers.

Fully offline. Replies answer inside ``<answer>…</answer>``; the score is the task's own
``score_answer`` plus ``format_weight`` for a well-formed reply. Difficulty settings go to each
task's generator through ``task_configs`` (e.g. ``{"basic_arithmetic": {"max_digits": 2}}``).
A ``held_out_fraction`` of each task's problem space (split by a hash of the problem) is never
drawn for training; ``evaluate`` scores ``eval_size`` distinct problems from it, graded
strict, lenient and for format (atroposlib.envs.heldout, atroposlib.envs.reward_fns.graded).
Run: ``python environments/reasoning_gym/env.py process --config <folder>/config.yaml``
"""

import difflib
import logging
import random
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import reasoning_gym
from pydantic import Field, field_validator, model_validator
from reasoning_gym.factory import DATASETS

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.evaluation import gather_with_progress
from atroposlib.envs.heldout import (
    Disjointness,
    HeldOutSplit,
    canonical_problem,
    check_disjoint,
    held_out_problems,
    training_problems,
)
from atroposlib.envs.reward_fns.answers import extract_answer_tag, extract_final_number
from atroposlib.envs.reward_fns.format_rewards import answer_tag_format_credit
from atroposlib.envs.reward_fns.graded import grade_answer
from atroposlib.envs.rollouts import greedy_reply, sample_group
from atroposlib.envs.selection import RevisitPool, SignalSelector
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

SYSTEM_PROMPT = "Reply with the final answer inside <answer></answer>."

logger = logging.getLogger(__name__)


class ReasoningGymConfig(BaseEnvConfig):
    tasks: dict[str, float] = Field(
        default={"basic_arithmetic": 1.0}, description="Task names and their sampling weights."
    )
    task_configs: dict[str, dict[str, Any]] = Field(
        default={},
        description="Per-task generator settings (difficulty), passed to create_dataset.",
    )
    dataset_size: int = Field(default=10_000, ge=1, description="Training entries per task.")
    eval_size: int = Field(
        default=50, ge=1, description="Distinct held-out problems evaluated per task."
    )
    held_out_fraction: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Share of each task's problems kept for evaluation only, chosen by a hash "
        "of the problem, so training never draws them (0: none held out; evaluation then "
        "refuses to start if it meets a training problem).",
    )
    seed: int = Field(default=0, description="Seed of the training data; eval uses seed + 1.")
    train_seed: int | None = Field(
        default=None, description="Seed of the training stream instead of seed (default: seed)."
    )
    held_out_seed: int | None = Field(
        default=None,
        description="Seed of the held-out draws instead of seed + 1 (default: seed + 1).",
    )
    held_out_exclude_seed: int | None = Field(
        default=None,
        description="Never evaluate the eval_size held-out problems this seed draws: a "
        "validation set disjoint from that seed's test set (benchmarks/learning_vs_trl.py).",
    )
    system_prompt: str = Field(
        default=SYSTEM_PROMPT, description="System message of every prompt ('' for none)."
    )
    instruction: str = Field(
        default="", description="Text appended to each question in the user message."
    )
    examples: list[tuple[str, str]] = Field(
        default=[],
        description="Worked examples (question, reply) shown before every question as earlier "
        "chat turns (few-shot; the instruction is appended to each example question too). "
        "Their problems are never evaluated and count as seen by the held-out check.",
    )
    format_weight: float = Field(default=0.2, ge=0, description="Added for a well-formed reply.")
    partial_format: bool = Field(
        default=False,
        description="Format reward with partial credit on the way to the exact shape (a tag, a "
        "closed block, the block's share of the reply), for a model that never writes the "
        "exact shape yet; the exact shape still earns the whole format_weight.",
    )
    max_completion_tokens: int = Field(default=256, ge=1, description="Tokens per answer.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    lenient_answers: bool = Field(
        default=False,
        description="Without an <answer> tag, grade the reply's final number instead of 0 "
        "(for small models that do not follow the format yet; the tag still earns the "
        "format reward).",
    )
    screen_replies: int = Field(
        default=0,
        ge=0,
        description="Sample this many replies of a group first and the rest only when their "
        "scores differ (a group whose first replies agree is dropped there, its other replies "
        "never sampled); 0: the whole group at once. Needs ensure_scores_are_not_same.",
    )
    screen_settled_logprob: float | None = Field(
        default=None,
        le=0,
        description="With screen_replies: stop a group only when its first replies are also "
        "ones the engine sampled with a total logprob of at least this (-0.05: replies it gives "
        "95 in 100 times, which the rest would almost surely repeat); none: whenever their "
        "scores agree.",
    )
    select_by_signal: bool = Field(
        default=False,
        description="Skip problems of the kinds (task, size, carries in a sum) whose recent "
        "groups mostly scored all-equal: each kind is drawn in proportion to the share of its "
        "last selection_window groups that taught something, never below selection_floor.",
    )
    revisit_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of draws that give a problem another group when its last one "
        "taught (scores differed), the longest waiting first; 0: every draw a new problem.",
    )
    revisit_max_groups: int = Field(
        default=4, ge=1, description="Groups one problem may have in all, with revisit_share."
    )
    selection_window: int = Field(default=32, ge=1, description="Groups remembered per kind.")
    selection_floor: float = Field(
        default=0.1, gt=0, le=1, description="Least probability of drawing a problem's kind."
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

    @model_validator(mode="after")
    def screening_drops_groups(self) -> "ReasoningGymConfig":
        if self.screen_replies and self.screen_replies >= self.group_size:
            raise ValueError(
                f"screen_replies {self.screen_replies} with group_size {self.group_size}: "
                "screen fewer replies than the group has (or 0 to sample it at once)"
            )
        if self.screen_replies and not self.ensure_scores_are_not_same:
            raise ValueError(
                "screen_replies stops a group whose first replies agree, which only an env "
                "that drops all-equal groups may do: set ensure_scores_are_not_same true or "
                "screen_replies 0"
            )
        return self


def grade(reply: str, entry: dict, dataset: Any, lenient: bool = False) -> float:
    """The task's own score of the ``<answer>`` content (or, if lenient, the final number)."""
    answer = extract_answer_tag(reply)
    if not answer and lenient:  # no tag, or an empty one: the final number
        answer = extract_final_number(reply) or answer
    return float(dataset.score_answer(answer, entry)) if answer is not None else 0.0


def score_reply(
    reply: str,
    entry: dict,
    dataset: Any,
    format_weight: float,
    lenient: bool = False,
    partial_format: bool = False,
) -> float:
    """Correctness plus the format component."""
    correct = grade(reply, entry, dataset, lenient)
    return correct + format_weight * answer_tag_format_credit(partial_format)([reply])[0]


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

    async def setup(self) -> None:
        """Training stream and held-out set from disjoint slices; refuses to start if they meet."""
        problems = build_problems(self.config)
        self.train, self.test, self.scorers = problems.train, problems.test, problems.scorers
        self.disjointness = problems.disjointness
        logger.info("held-out check: %s", self.disjointness)
        self.rng = random.Random(self.config.seed)
        self.position = dict.fromkeys(self.train, 0)
        self.selector: SignalSelector | None = None
        if self.config.select_by_signal:
            window = self.config.selection_window
            self.selector = SignalSelector(
                random.Random(self.config.seed + 1), window=window,
                min_groups=min(8, window), floor=self.config.selection_floor,
            )  # fmt: skip
        self.revisits: RevisitPool | None = None
        if self.config.revisit_share:
            self.revisits = RevisitPool(random.Random(self.config.seed + 2),
                                        self.config.revisit_share,
                                        max_groups=self.config.revisit_max_groups)  # fmt: skip

    async def get_next_item(self) -> Item:
        revisit = self.revisits.draw() if self.revisits is not None else None
        if revisit is not None:
            return revisit
        names, weights = zip(*self.config.tasks.items(), strict=True)
        while True:
            task = self.rng.choices(names, weights=weights)[0]
            index = self.position[task] % len(self.train[task])
            self.position[task] += 1
            entry = self.train[task][index]
            if self.selector is None or self.selector.admit(problem_kind(task, entry)):
                return {"task": task, "entry": entry}

    def prompt(self, question: str) -> list[dict]:
        return chat_prompt(self.config, question)

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        entry, dataset = item["entry"], self.scorers[item["task"]]
        weight, lenient = self.config.format_weight, self.config.lenient_answers
        partial = self.config.partial_format
        group = await sample_group(
            self.server,
            self.tokenizer,
            self.prompt(entry["question"]),
            lambda replies: [
                score_reply(r, entry, dataset, weight, lenient, partial) for r in replies
            ],
            n=self.config.group_size,
            max_tokens=self.config.max_completion_tokens,
            temperature=self.config.temperature,
            screen=self.config.screen_replies,
            settled_logprob=self.config.screen_settled_logprob,
        )
        if self.selector is not None:
            self.selector.record(problem_kind(item["task"], entry), group.scores)
        if self.revisits is not None:
            self.revisits.record(entry_key(entry), item, group.scores)
        return group, []

    async def evaluate(self, *args, **kwargs) -> None:
        started = time.time()
        pairs = [(task, entry) for task, dataset in self.test.items() for entry in dataset]
        samples = await gather_with_progress(
            [self.evaluate_one(t, e) for t, e in pairs], self.config.data_dir_to_save_evals
        )
        metrics = {}
        for task in self.test:
            scores = [s["score"] for s in samples if s["task"] == task]
            metrics[f"eval/{task}/accuracy"] = sum(scores) / len(scores)
        metrics["eval/accuracy"] = sum(s["score"] for s in samples) / len(samples)
        for grade in ("strict", "lenient", "formatted"):
            metrics[f"eval/{grade}"] = sum(s[grade] for s in samples) / len(samples)
        metrics.update(self.disjointness.as_metrics())
        await self.evaluate_log(metrics, samples=samples, start_time=started, end_time=time.time())

    async def evaluate_one(self, task: str, entry: dict) -> dict:
        """Greedy answer to one held-out problem (all of them are in flight at once)."""
        prompt = self.prompt(entry["question"])
        reply = await greedy_reply(
            self.server, prompt, max_tokens=self.config.max_completion_tokens
        )
        scorer = self.scorers[task]
        score = grade(reply, entry, scorer, self.config.lenient_answers)
        graded = grade_answer(reply, lambda answer: scorer.score_answer(answer, entry) >= 1.0)
        return {"task": task, "question": entry["question"], "response": reply,
                "answer": entry["answer"], "score": score, "problem": entry_key(entry),
                "strict": graded.strict, "lenient": graded.lenient,
                "formatted": graded.formatted}  # fmt: skip


@dataclass(frozen=True)
class Problems:
    """The training stream, the held-out set and each task's scorer, from disjoint slices."""

    train: dict[str, list[dict]]
    test: dict[str, list[dict]]
    scorers: dict[str, Any]
    """``score_answer(answer, entry)`` of each task."""
    disjointness: Disjointness


def build_problems(config: ReasoningGymConfig) -> Problems:
    """What ``setup`` trains and evaluates on (also the TRL side of benchmarks/learning_vs_trl.py).

    Raises ``HeldOutOverlapError`` if a held-out problem is in the training pool.
    """
    split = HeldOutSplit(config.held_out_fraction)
    train_seed = config.seed if config.train_seed is None else config.train_seed
    draws = make_datasets(config, int(4 * config.dataset_size + _budget(config)), train_seed)
    train = {
        name: training_problems(_entries(ds), entry_key, split, config.dataset_size)
        for name, ds in draws.items()
    }
    shown = example_keys(config)
    excluded = set(shown)
    if config.held_out_exclude_seed is not None:
        other = held_out_sets(config, config.held_out_exclude_seed, shown)
        excluded.update(entry_key(e) for entries in other.values() for e in entries)
    held_out_seed = config.seed + 1 if config.held_out_seed is None else config.held_out_seed
    test = held_out_sets(config, held_out_seed, excluded)
    disjointness = check_disjoint(
        [entry_key(e) for entries in test.values() for e in entries],
        [*(entry_key(e) for entries in train.values() for e in entries), *shown],
        split.fraction,
    )
    return Problems(train, test, draws, disjointness)


def held_out_sets(
    config: ReasoningGymConfig, seed: int, exclude: set[str]
) -> dict[str, list[dict]]:
    """``eval_size`` distinct held-out problems per task, drawn with ``seed``, none in
    ``exclude``."""
    split = HeldOutSplit(config.held_out_fraction)
    return {
        name: held_out_problems(_entries(ds), entry_key, split, config.eval_size, exclude=exclude)
        for name, ds in make_datasets(config, _budget(config), seed).items()
    }


def _budget(config: ReasoningGymConfig) -> int:
    """Draws enough for ``eval_size`` held-out problems (and as many excluded) per task."""
    return int(10 * config.eval_size / (config.held_out_fraction or 1.0) + 1_000)


def make_datasets(config: ReasoningGymConfig, size: int, seed: int) -> dict[str, Any]:
    return {
        name: reasoning_gym.create_dataset(
            name, size=size, seed=seed, **config.task_configs.get(name, {})
        )
        for name in config.tasks
    }


def chat_prompt(config: ReasoningGymConfig, question: str) -> list[dict]:
    """The system message (if any), the worked examples as earlier turns, and the question,
    each question with the instruction appended."""
    messages = [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []
    for example_question, example_reply in config.examples:
        messages.append(
            {"role": "user", "content": f"{example_question} {config.instruction}".strip()}
        )
        messages.append({"role": "assistant", "content": example_reply})
    messages.append({"role": "user", "content": f"{question} {config.instruction}".strip()})
    return messages


_EXPRESSION = re.compile(r"\d+(?:\s*[-+*/]\s*\d+)+")
_ANIMALS = re.compile(r"legs are there in total if you have (\d+ [a-z ]+(?:, \d+ [a-z ]+)*)\?")


def example_keys(config: ReasoningGymConfig) -> set[str]:
    """The problem keys of the worked examples, as ``entry_key`` would name them in each task
    (an arithmetic expression in the question text stands in for the generator's metadata)."""
    keys = set()
    for question, _ in config.examples:
        expression, animals = _EXPRESSION.search(question), _ANIMALS.search(question)
        metadata: dict[str, Any] = {"expression": expression.group()} if expression else {}
        if animals:  # "2 cats, 1 spider": the generator adds an s to a count above 1
            counted = (item.split(" ", 1) for item in animals.group(1).split(", "))
            metadata = {"animals": {(a[:-1] if int(n) > 1 else a): int(n) for n, a in counted}}
        keys.update(f"{task}:{_canonical(question, metadata)}" for task in config.tasks)
    return keys


_SUM = re.compile(r"\d+(?:\s*\+\s*\d+)+")


def problem_kind(task: str, entry: dict) -> str:
    """What makes problems alike for ``select_by_signal``: the task, its per-problem sizes
    (``num_*`` metadata: terms, digits, animals) and, for a plain sum, its column carries.

    >>> problem_kind("basic_arithmetic", {"metadata": {"expression": "47 + 77", "num_terms": 2}})
    'basic_arithmetic num_terms=2 carries=2'
    """
    metadata = entry.get("metadata") or {}
    sizes = [f"{k}={v}" for k, v in sorted(metadata.items()) if k.startswith("num_")
             and isinstance(v, int)]  # fmt: skip
    expression = str(metadata.get("expression", ""))
    if _SUM.fullmatch(expression):
        sizes.append(f"carries={_carries([int(t) for t in expression.split('+')])}")
    return " ".join([task, *sizes])


def _carries(terms: list[int]) -> int:
    """Column carries when adding ``terms`` by hand (47 + 77: 7 + 7 carries, 4 + 7 + 1 too)."""
    carries, carry, column = 0, 0, 0
    while any(t // 10**column for t in terms) or carry:
        total = sum(t // 10**column % 10 for t in terms) + carry
        carry = total // 10
        carries += carry > 0
        column += 1
    return carries


def entry_key(entry: dict) -> str:
    """The canonical problem of a reasoning-gym entry, with its task's name."""
    metadata = entry.get("metadata") or {}
    return f"{metadata.get('source_dataset', '')}:{_canonical(entry['question'], metadata)}"


def _canonical(question: str, metadata: dict[str, Any]) -> str:
    """``canonical_problem``; leg_counting's animals in any order are one problem."""
    animals = metadata.get("animals")
    if isinstance(animals, dict):
        return "legs of " + ", ".join(f"{n} {a}" for a, n in sorted(animals.items()))
    return canonical_problem(question, metadata)


def _entries(dataset: Any) -> Iterator[dict]:
    return (dataset[index] for index in range(len(dataset)))


if __name__ == "__main__":
    ReasoningGymEnv.cli()
