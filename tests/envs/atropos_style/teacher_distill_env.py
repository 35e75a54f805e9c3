"""Atropos-style on-policy distillation env (gsm8k_server_teacher_distill's pattern)."""

from typing import List, Optional, Tuple

from atroposlib.envs.base import APIServerConfig, ScoredDataGroup
from atroposlib.envs.teacher_distillation_env import (
    TeacherDistillationConfig,
    TeacherDistillationEnv,
)
from atroposlib.type_definitions import Item


class TeacherEnv(TeacherDistillationEnv):
    name = "teacher_distill"
    env_config_cls = TeacherDistillationConfig

    @classmethod
    def config_init(cls) -> Tuple[TeacherDistillationConfig, List[APIServerConfig]]:
        config = TeacherDistillationConfig(
            group_size=2, use_wandb=False, teacher_enabled=True, teacher_top_k=3
        )
        return config, [APIServerConfig(server_type="sglang")]

    @classmethod
    def teacher_config_init(cls) -> APIServerConfig:
        return APIServerConfig(server_type="sglang", base_url="http://localhost:9003/v1")

    async def get_next_item(self) -> Optional[Item]:
        return "Name a colour."

    async def collect_trajectories(self, item: Item) -> Tuple[ScoredDataGroup, List[Item]]:
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            await managed.chat_completion(
                messages=[{"role": "user", "content": item}],
                n=self.config.group_size,
                max_tokens=12,
            )
            nodes = managed.get_state()["nodes"]
        return ScoredDataGroup(
            tokens=[n.tokens for n in nodes],
            masks=[n.masked_tokens for n in nodes],
            inference_logprobs=[n.logprobs for n in nodes],
            scores=[float(len(n.tokens)) for n in nodes],
        ), []


if __name__ == "__main__":
    TeacherEnv.cli()
