"""Letter counting: "How many times does 'r' appear in 'strawberry'?", generated offline.

Words come from a built-in list or are random letter strings (``random_words``); difficulty is
the number of words per question. Replies answer inside ``<answer>…</answer>``; the score is
1.0 for the right count plus ``format_weight`` for a well-formed reply.
"""

import asyncio
import random
import string
import time

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.reward_fns.answers import extract_answer_tag, normalize_number
from atroposlib.envs.reward_fns.format_rewards import answer_tag_format_reward
from atroposlib.envs.rollouts import greedy_reply, sample_group
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

WORDS = [
    "strawberry",
    "banana",
    "mississippi",
    "bookkeeper",
    "committee",
    "balloon",
    "assessment",
    "parallel",
    "coffee",
    "letter",
    "success",
    "cherry",
    "tomorrow",
    "address",
    "accommodate",
    "possession",
    "occurrence",
    "millennium",
    "embarrass",
    "necessary",
    "referral",
    "vacuum",
    "giraffe",
    "hippopotamus",
    "bubble",
    "puzzle",
    "pepper",
    "happiness",
    "grammar",
    "llama",
    "kayak",
    "level",
    "rhythm",
    "syzygy",
    "queue",
    "onomatopoeia",
    "abracadabra",
    "pineapple",
    "raspberry",
    "tennessee",
    "connecticut",
    "massachusetts",
]
SYSTEM_PROMPT = "Count carefully. Reply with the number inside <answer></answer>."


class LetterCountingConfig(BaseEnvConfig):
    min_words: int = Field(default=1, ge=1, description="Fewest words in a question.")
    max_words: int = Field(default=1, ge=1, description="Most words in a question.")
    random_words: bool = Field(default=False, description="Random letter strings, not words.")
    seed: int = Field(default=0, description="Seed of the question generator.")
    format_weight: float = Field(default=0.2, ge=0, description="Added for a well-formed reply.")
    max_completion_tokens: int = Field(default=64, ge=1, description="Tokens per answer.")
    eval_size: int = Field(default=50, ge=1, description="Questions used by evaluate().")


def make_question(rng: random.Random, config: LetterCountingConfig) -> dict:
    count = rng.randint(config.min_words, max(config.min_words, config.max_words))
    if config.random_words:
        words = ["".join(rng.choices("abcdefgh", k=rng.randint(4, 10))) for _ in range(count)]
    else:
        words = [rng.choice(WORDS) for _ in range(count)]
    text = " ".join(words)
    letter = rng.choice(sorted(set(text) - {" "}) or string.ascii_lowercase)
    question = f"How many times does the letter '{letter}' appear in '{text}'?"
    return {"question": question, "answer": str(text.count(letter))}


def letter_count_reward(completions: list[str], answer: list[str], format_weight: float = 0.2):
    """1.0 for the right count in ``<answer>`` plus ``format_weight`` for the format.

    >>> letter_count_reward(["<answer>3</answer>", "<answer>2</answer>", "3", ""], ["3"] * 4)
    [1.2, 0.2, 0.0, 0.0]
    """
    scores = []
    forms = answer_tag_format_reward(completions)
    for reply, gold, form in zip(completions, answer, forms, strict=True):
        tagged = extract_answer_tag(reply)
        correct = tagged is not None and normalize_number(tagged) == gold
        scores.append(round(float(correct) + format_weight * form, 6))
    return scores


class LetterCountingEnv(BaseEnv):
    name = "letter_counting"
    env_config_cls = LetterCountingConfig

    @classmethod
    def config_init(cls) -> tuple[LetterCountingConfig, list[APIServerConfig]]:
        config = LetterCountingConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=8,
            max_token_length=256,
            total_steps=500,
            steps_per_eval=50,
        )
        return config, [
            APIServerConfig(
                model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
            )
        ]

    async def setup(self) -> None:
        self.rng = random.Random(self.config.seed)
        eval_rng = random.Random(self.config.seed + 1)
        self.test = [make_question(eval_rng, self.config) for _ in range(self.config.eval_size)]

    async def get_next_item(self) -> Item:
        return make_question(self.rng, self.config)

    def prompt(self, question: str) -> list[dict]:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        weight = self.config.format_weight
        group = await sample_group(
            self.server,
            self.tokenizer,
            self.prompt(item["question"]),
            lambda replies: letter_count_reward(replies, [item["answer"]] * len(replies), weight),
            n=self.config.group_size,
            max_tokens=self.config.max_completion_tokens,
        )
        return group, []

    async def evaluate(self, *args, **kwargs) -> None:
        started = time.time()
        samples = await asyncio.gather(*(self.evaluate_one(row) for row in self.test))
        accuracy = sum(s["score"] for s in samples) / len(samples)
        await self.evaluate_log(
            {"eval/accuracy": accuracy}, samples=samples, start_time=started, end_time=time.time()
        )

    async def evaluate_one(self, row: dict) -> dict:
        """Greedy answer to one test question (all of them are in flight at once)."""
        prompt = self.prompt(row["question"])
        reply = await greedy_reply(
            self.server, prompt, max_tokens=self.config.max_completion_tokens
        )
        correct = letter_count_reward([reply], [row["answer"]], 0.0)[0]
        return {**row, "response": reply, "score": correct}


if __name__ == "__main__":
    LetterCountingEnv.cli()
