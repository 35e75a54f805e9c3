"""An Atropos 0.4-style env whose ``process`` / ``evaluate`` output is compared byte for byte
with the 0.4.0 wheel's (tests/envs/test_atropos_output_compat.py): one chat per rollout,
a ``wandb_log`` override that records each call (to ``$WANDB_LOG_RECORD``), an evaluate()
that reports through ``evaluate_log``."""

import json
import os
from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataItem
from atroposlib.type_definitions import Item


class OutputCompatEnv(BaseEnv):
    name = "output_compat"

    @classmethod
    def config_init(cls) -> Tuple[BaseEnvConfig, List[APIServerConfig]]:
        config = BaseEnvConfig(group_size=2, use_wandb=False, max_token_length=256)
        return config, [APIServerConfig(model_name="fake", timeout=30)]

    async def setup(self) -> None:
        self.next_id = 0

    async def get_next_item(self) -> Optional[Item]:
        self.next_id += 1
        return {"question": f"What is {self.next_id} + 1?", "answer": str(self.next_id + 1)}

    async def collect_trajectory(self, item: Item) -> Tuple[Optional[ScoredDataItem], List[Item]]:
        chat = [{"role": "user", "content": item["question"]}]
        completion = await self.server.chat_completion(messages=chat, n=1, max_tokens=8)
        reply = completion.choices[0].message.content
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        prompt = self.tokenizer.encode(text, add_special_tokens=False)
        output = self.tokenizer.encode(reply, add_special_tokens=False)
        tokens = list(prompt) + output
        scored = ScoredDataItem(
            tokens=tokens,
            masks=[-100] * len(prompt) + output,
            scores=1.0 if item["answer"] in reply else -1.0,
            messages=chat + [{"role": "assistant", "content": reply}],
        )
        return scored, []

    async def evaluate(self, *args, **kwargs) -> None:
        await self.evaluate_log(
            metrics={"eval/accuracy": 0.5},
            samples=[{"question": "What is 1 + 1?", "score": 1.0}],
            start_time=0.0,
            end_time=1.0,
            generation_parameters={"temperature": 0.0},
        )

    async def wandb_log(self, wandb_metrics: Optional[dict] = None) -> None:
        record = os.environ.get("WANDB_LOG_RECORD")
        if record:
            with open(record, "a") as handle:
                line = {"metrics": sorted(wandb_metrics or {}), "use_wandb": self.config.use_wandb}
                handle.write(json.dumps(line) + "\n")
        await super().wandb_log(wandb_metrics)


if __name__ == "__main__":
    OutputCompatEnv.cli()
