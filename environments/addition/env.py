"""Two-digit sums, trained token-in/token-out, with held-out problems atropos-local grades.

The environment of docs/writing-an-environment.md, "Train your own environment on this
machine". A tenth of the 4,095 distinct sums (a + b and b + a are one problem) is held out by a
hash of the problem: training never draws it, and ``evaluate`` answers ``eval_size`` of them
greedily. Run: ``atropos-local --env-script environments/addition/env.py --env-config
environments/addition/config.yaml``.
"""

import random
import time
from collections.abc import Iterator

from pydantic import Field

from atroposlib.envs.base import BaseEnv
from atroposlib.envs.evaluation import gather_with_progress
from atroposlib.envs.heldout import (
    HeldOutSplit,
    check_disjoint,
    held_out_problems,
    training_problems,
)
from atroposlib.envs.heldout_eval import HeldOutEvalConfig, graded_sample, held_out_metrics
from atroposlib.envs.reward_fns.answers import extract_answer_tag
from atroposlib.envs.reward_fns.format_rewards import answer_tag_format_reward
from atroposlib.envs.rollouts import greedy_reply
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.group import ScoredData

Problem = tuple[int, int]
INSTRUCTION = "Give only the result inside <answer></answer> tags."
EXAMPLE: Problem = (12, 35)  # shown as a worked example: never evaluated


class AdditionConfig(HeldOutEvalConfig):
    pool_size: int = Field(default=2000, ge=1, description="Training problems.")
    max_completion_tokens: int = Field(default=24, ge=1, description="Tokens per reply.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    format_weight: float = Field(default=0.1, ge=0, description="Added for a well-formed reply.")


def draws(seed: int) -> Iterator[Problem]:
    rng = random.Random(seed)
    while True:
        yield rng.randint(10, 99), rng.randint(10, 99)


def key(problem: Problem) -> str:
    """The problem's name, whatever the order of its terms.

    >>> key((35, 12))
    '12+35'
    """
    return "+".join(str(term) for term in sorted(problem))


def question(problem: Problem) -> str:
    return f"Calculate {problem[0]} + {problem[1]}. {INSTRUCTION}"


def prompt(problem: Problem) -> list[dict[str, str]]:
    """The worked example as an earlier turn, then the question."""
    return [
        {"role": "user", "content": question(EXAMPLE)},
        {"role": "assistant", "content": f"<answer>{sum(EXAMPLE)}</answer>"},
        {"role": "user", "content": question(problem)},
    ]


def reward(reply: str, problem: Problem, format_weight: float) -> float:
    """1 for the right sum inside <answer></answer>, plus ``format_weight`` for the shape.

    >>> reward("<answer>47</answer>", (12, 35), 0.1), reward("47", (12, 35), 0.1)
    (1.1, 0.0)
    """
    right = extract_answer_tag(reply) == str(sum(problem))
    return float(right) + format_weight * answer_tag_format_reward([reply])[0]


class AdditionEnv(BaseEnv):
    name = "addition"
    env_config_cls = AdditionConfig

    @classmethod
    def config_init(cls) -> tuple[AdditionConfig, list[APIServerConfig]]:
        config = AdditionConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=4,
            max_token_length=256,
            use_wandb=False,
        )
        server = APIServerConfig(
            model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
        )
        return config, [server]

    async def setup(self) -> None:
        """Training pool and held-out set from disjoint slices; refuses to start if they meet."""
        split = HeldOutSplit(self.config.held_out_fraction)
        self.train = training_problems(draws(0), key, split, self.config.pool_size)
        self.held_out = held_out_problems(
            draws(1), key, split, self.config.eval_size, exclude={key(EXAMPLE)}
        )
        self.disjointness = check_disjoint(
            [key(p) for p in self.held_out], [key(EXAMPLE), *map(key, self.train)], split.fraction
        )
        self.position = 0

    async def get_next_item(self) -> Problem:
        self.position += 1
        return self.train[self.position % len(self.train)]

    async def collect_trajectories(self, item: Problem) -> tuple[ScoredData, list[Problem]]:
        sampler = self.token_sampler()  # the config's max_completion_tokens and temperature
        replies = await sampler.sample(sampler.start(prompt(item)), n=self.config.group_size)
        scores = [reward(r.reply, item, self.config.format_weight) for r in replies]
        return sampler.group(replies, scores), []

    async def evaluate(self, *args, **kwargs) -> None:
        started = time.time()
        samples = await gather_with_progress(
            [self.answer(p) for p in self.held_out], self.config.data_dir_to_save_evals
        )
        metrics = held_out_metrics(samples, self.disjointness)
        await self.evaluate_log(metrics, samples=samples, start_time=started, end_time=time.time())

    async def answer(self, problem: Problem) -> dict:
        """A greedy reply to one held-out problem, graded strict, lenient and for format."""
        reply = await greedy_reply(
            self.server, prompt(problem), max_tokens=self.config.max_completion_tokens
        )
        return graded_sample(
            key(problem), question(problem), reply, lambda answer: answer == str(sum(problem))
        )


if __name__ == "__main__":
    AdditionEnv.cli()
