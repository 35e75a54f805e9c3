"""Code game: a writer writes a program, a predictor (the same model) guesses its output.

Zero-sum on programs that run and print: the writer scores ``1 - 2p`` where ``p`` is the share
of the ``predictor_samples`` guesses that were right (+1 none right, -1 all right); each guess
scores +1 when right and -1 when wrong (the mirror). A program that fails to run or prints
nothing scores -1 for the writer and is not shown to the predictor; so does a program whose output
changes between runs (each runs ``determinism_runs`` times, with different hash seeds), so
only deterministic programs can win. Sequences carry ``overrides[i]["role"]`` (``writer`` /
``predictor``) and writers ``overrides[i]["sandbox_status"]`` for role-conditioned baselines.
"""

import asyncio
import random

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.reward_fns.answers import extract_answer_tag
from atroposlib.envs.reward_fns.code_rewards import extract_python_code, outputs_match
from atroposlib.envs.rollouts import TokenSampler
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.trajectory import Trajectory
from atroposlib.group import ScoredData
from atroposlib.sandbox import SandboxLimits, SandboxResult, arun_python
from atroposlib.sandbox.envs import check_env_sandbox, gather_runs
from atroposlib.type_definitions import Item

THEMES = ["string slicing", "integer division", "list comprehensions", "dictionaries",
          "recursion", "sorting with keys", "sets", "bit operations", "while loops"]  # fmt: skip
WRITER_PROMPT = (
    "Write a short Python program (at most 12 lines, no input, no randomness) about {theme} "
    "that prints one line. Another player must predict the output: make it tricky but "
    "deterministic. Reply with one ```python code block."
)
PREDICTOR_PROMPT = (
    "What exactly does this program print?\n```python\n{code}\n```\n"
    "Reply with the output inside <answer></answer>."
)


class CodeGameConfig(BaseEnvConfig):
    predictor_samples: int = Field(default=4, ge=1, description="Guesses per runnable program.")
    sandbox: SandboxLimits = Field(
        default_factory=lambda: SandboxLimits(cpu_seconds=2, wall_seconds=5),
        description="Limits for the writer's programs.",
    )
    max_completion_tokens: int = Field(default=384, ge=1, description="Tokens per reply.")
    seed: int = Field(default=0, description="Seed of the theme order.")
    determinism_runs: int = Field(
        default=2,
        ge=2,
        description="Runs of each program (different hash seeds); outputs "
        "that differ make it unplayable (-1 for the writer).",
    )


same_output = outputs_match  # a guess is right when it matches the output line by line


def playable(runs: list[SandboxResult]) -> tuple[str, str]:
    """(status, output) of a program run several times: ``ok`` when every run ended OK with the
    same non-empty output, ``nondeterministic`` when the outputs differ, else the failure.

    >>> from atroposlib.sandbox import Isolation, SandboxStatus
    >>> def ran(out):
    ...     return SandboxResult(status=SandboxStatus.OK, stdout=out, stderr_tail="",
    ...                          duration_s=0.1, exit_code=0, isolation=Isolation.NAMESPACES)
    >>> playable([ran("7\\n"), ran("7\\n")]), playable([ran("{'a', 'b'}"), ran("{'b', 'a'}")])
    (('ok', '7\\n'), ('nondeterministic', ''))
    >>> playable([ran(""), ran("")])
    ('silent', '')
    """
    failed = next((run for run in runs if not run.ok), None)
    if failed is not None:
        return failed.status.value, ""
    outputs = {run.stdout for run in runs}
    if len(outputs) > 1:
        return "nondeterministic", ""
    output = outputs.pop()
    return ("ok", output) if output.strip() else ("silent", "")


class CodeGameEnv(BaseEnv):
    name = "code_game"
    env_config_cls = CodeGameConfig

    @classmethod
    def config_init(cls) -> tuple[CodeGameConfig, list[APIServerConfig]]:
        config = CodeGameConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=4,
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
        self.rng = random.Random(self.config.seed)

    async def get_next_item(self) -> Item:
        return {"theme": self.rng.choice(THEMES)}

    async def ask(self, sampler: TokenSampler, content: str, n: int) -> list[Trajectory]:
        return await sampler.sample(sampler.start([{"role": "user", "content": content}]), n=n)

    async def run_repeatedly(self, code: str) -> list[SandboxResult]:
        """The program's runs, each with its own hash seed (set iteration order, ``hash()``);
        start times, memory addresses and random seeds differ by themselves."""
        return await asyncio.gather(*(
            arun_python(code, limits=self.config.sandbox, hash_seed=seed)
            for seed in range(1, self.config.determinism_runs + 1)
        ))  # fmt: skip

    async def predict(self, code: str, output: str) -> tuple[ScoredData, float]:
        """The predictor's group for one program and the share of right guesses."""
        k, sampler = self.config.predictor_samples, self.token_sampler()
        guesses = await self.ask(sampler, PREDICTOR_PROMPT.format(code=code), k)
        right = [same_output(extract_answer_tag(guess.reply), output) for guess in guesses]
        group = sampler.group(
            guesses, [1.0 if r else -1.0 for r in right],
            overrides=[{"role": "predictor"}] * k, group_overrides={"group_size": k},
        )  # fmt: skip
        return group, sum(right) / k

    async def collect_trajectories(self, item: Item) -> tuple[list[ScoredData], list[Item]]:
        sampler = self.token_sampler()
        programs = await self.ask(
            sampler, WRITER_PROMPT.format(theme=item["theme"]), self.config.group_size
        )
        codes = [extract_python_code(program.reply) for program in programs]
        runs = await gather_runs(self, (self.run_repeatedly(code) for code in codes))
        outcomes = [playable(program_runs) for program_runs in runs]
        ready = [i for i, (status, _) in enumerate(outcomes) if status == "ok"]
        predictions = await asyncio.gather(*(self.predict(codes[i], outcomes[i][1]) for i in ready))
        writer_scores = [-1.0] * len(programs)
        for index, (_, share_right) in zip(ready, predictions, strict=True):
            writer_scores[index] = 1.0 - 2.0 * share_right
        writer = sampler.group(
            programs, writer_scores, overrides=[{"role": "writer"}] * len(programs),
            extra=[{"sandbox_status": status} for status, _ in outcomes],
        )  # fmt: skip
        return [writer, *(group for group, _ in predictions)], []


if __name__ == "__main__":
    CodeGameEnv.cli()
