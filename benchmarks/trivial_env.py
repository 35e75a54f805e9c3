"""The benchmark's environment: one chat request per group, trivial scoring, fixed tokens.

The same file runs on atroposlib 0.4.0 and on ours (source compatibility); its settings come
from environment variables so that neither CLI is involved.
"""

# Written in Atropos 0.4 style on purpose (typing.List, concatenation): the user's view.
# ruff: noqa: UP006, UP035, UP045

import os
from typing import List, Optional, Tuple

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import APIServerConfig

PROMPT = list(range(1000, 1032))


class TrivialEnv(BaseEnv):
    name = "trivial"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        config = BaseEnvConfig(
            tokenizer_name=os.environ["BENCH_TOKENIZER"],
            group_size=8,
            wandb_name="trivial",
            use_wandb=False,
            rollout_server_url=os.environ["BENCH_BROKER"],
            total_steps=int(os.environ.get("BENCH_STEPS", "100000")),
            max_token_length=512,
            steps_per_eval=0,
            max_num_workers=int(os.environ.get("BENCH_WORKERS", "16")),
            max_batches_offpolicy=4,
        )
        server = APIServerConfig(
            model_name="fake", base_url=os.environ["BENCH_INFERENCE"], api_key="x", timeout=30
        )
        return config, [server]

    async def setup(self):
        self.counter = 0

    async def get_next_item(self):
        self.counter += 1
        return self.counter

    async def collect_trajectories(self, item) -> Tuple[Optional[ScoredDataGroup], list]:
        completion = await self.server.chat_completion(
            messages=[{"role": "user", "content": f"item {item}"}], n=self.config.group_size
        )
        tokens, masks, scores = [], [], []
        for index, _choice in enumerate(completion.choices):
            answer = [2000 + (item + index + j) % 500 for j in range(32)]
            tokens.append(PROMPT + answer)
            masks.append([-100] * len(PROMPT) + answer)
            scores.append(float(index % 2))
        return ScoredDataGroup(tokens=tokens, masks=masks, scores=scores), []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    TrivialEnv.cli()
