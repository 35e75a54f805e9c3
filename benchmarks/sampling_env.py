"""The env-overhead benchmark's sampling environment: the token path against the text path.

``BENCH_PATH=token``: ``sample_group`` (``/generate`` with the prompt's ids; the group is the
sampled ids). ``BENCH_PATH=text``: the path the catalogue envs took before the token path: a
chat completion, then each ``prompt + reply`` chat re-tokenized with the chat template
(``tokenize_for_trainer``) into an Atropos-style dict. Same fake server, prompt, group size,
reply length and trivial score; settings come from environment variables.
"""

import os

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.rollouts import sample_group
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

TOKEN_PATH = os.environ.get("BENCH_PATH", "token") == "token"
MAX_TOKENS = 96


def score(replies: list[str]) -> list[float]:
    return [float(index % 2) for index, _ in enumerate(replies)]


class SamplingEnv(BaseEnv):
    name = "sampling"

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        config = BaseEnvConfig(
            tokenizer_name=os.environ["BENCH_TOKENIZER"],
            group_size=8,
            wandb_name="sampling",
            use_wandb=False,
            rollout_server_url=os.environ["BENCH_BROKER"],
            total_steps=100000,
            max_token_length=512,
            steps_per_eval=0,
            max_num_workers=int(os.environ.get("BENCH_WORKERS", "16")),
            max_batches_offpolicy=4,
        )
        server = APIServerConfig(
            model_name="fake",
            base_url=os.environ["BENCH_INFERENCE"],
            api_key="x",
            timeout=30,
            server_type="sglang" if TOKEN_PATH else "openai",
        )
        return config, [server]

    async def setup(self) -> None:
        self.counter = 0

    async def get_next_item(self) -> int:
        self.counter += 1
        return self.counter

    async def collect_trajectories(self, item: int) -> tuple[object, list]:
        prompt = [{"role": "system", "content": "Answer briefly."},
                  {"role": "user", "content": f"What is {item} + {item}?"}]  # fmt: skip
        n = self.config.group_size
        if TOKEN_PATH:
            group = await sample_group(
                self.server, self.tokenizer, prompt, score, n=n, max_tokens=MAX_TOKENS
            )
            return group, []
        completion = await self.server.chat_completion(messages=prompt, n=n, max_tokens=MAX_TOKENS)
        replies = [choice.message.content or "" for choice in completion.choices]
        chats = [[*prompt, {"role": "assistant", "content": reply}] for reply in replies]
        rows = [tokenize_for_trainer(self.tokenizer, chat, include_messages=True) for chat in chats]
        group = {"tokens": [r["tokens"] for r in rows], "masks": [r["masks"] for r in rows],
                 "scores": score(replies), "messages": [r["messages"] for r in rows]}  # fmt: skip
        return group, []

    async def evaluate(self, *args: object, **kwargs: object) -> None:
        return None


if __name__ == "__main__":
    SamplingEnv.cli()
