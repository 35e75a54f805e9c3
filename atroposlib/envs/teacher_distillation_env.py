"""On-policy distillation (Atropos's last feature): groups carry a teacher's view of the
student's own tokens.

``TeacherDistillationEnv`` asks a second inference server (the teacher: vLLM, SGLang or our
embedded server, any that returns prompt logprobs) to score every sampled sequence as a
prompt, and fills each group's ``distill_token_ids`` / ``distill_logprobs``
(``[sequence][position][k]``): at each position the student's token first, then the
teacher's other top-k tokens, with the teacher's logprobs. Position 0 has none. The teacher
must share the student's tokenizer (token ids are passed as they are).

Teacher servers come from ``teacher_config_init()``, ``--teacher.<field>`` flags or a
``teacher:`` YAML key, in every command (Atropos wired them for ``serve`` only).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC
from collections.abc import Sequence
from typing import Any, cast

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup, Trajectories
from atroposlib.envs.constants import ENV_NAMESPACE, NAMESPACE_SEP, OPENAI_NAMESPACE
from atroposlib.envs.server_handling.server_baseline import (
    APIServerConfig,
    ServerBaseline,
    tokenizer_name_of,
)
from atroposlib.envs.server_handling.server_manager import ServerManager, ServerManagerConfig
from atroposlib.errors import ConfigError
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

logger = logging.getLogger(__name__)

__all__ = [
    "ENV_NAMESPACE",
    "NAMESPACE_SEP",
    "OPENAI_NAMESPACE",
    "APIServerConfig",
    "BaseEnv",
    "BaseEnvConfig",
    "ScoredDataGroup",
    "ServerBaseline",
    "ServerManager",
    "ServerManagerConfig",
    "TeacherDistillationConfig",
    "TeacherDistillationEnv",
]

TeacherConfigs = ServerBaseline | APIServerConfig | list[APIServerConfig]


class TeacherDistillationConfig(BaseEnvConfig):
    teacher_enabled: bool = Field(
        default=False, description="Fetch teacher logprobs of every group for distillation."
    )
    teacher_top_k: int = Field(
        default=0,
        ge=-1,
        description="Teacher tokens per position besides the sampled one (0: the sampled "
        "token only; -1: no teacher call).",
    )


class TeacherDistillationEnv(BaseEnv, ABC):
    """A ``BaseEnv`` whose groups are enriched with the teacher's top-k logprobs."""

    env_config_cls = TeacherDistillationConfig
    teacher_namespace = "teacher"

    @classmethod
    def teacher_config_init(cls) -> TeacherConfigs | None:
        """Default teacher server(s); ``--teacher.*`` flags and ``teacher:`` YAML override."""
        return None

    def __init__(
        self,
        config: TeacherDistillationConfig,
        server_configs: ServerBaseline | Sequence[APIServerConfig],
        teacher_server_configs: TeacherConfigs | None = None,
        slurm: bool = False,
        testing: bool = False,
    ) -> None:
        super().__init__(config, server_configs, slurm=slurm, testing=testing)
        self.teacher_server: ServerManager | None = None
        self._teacher_checked = False
        if not config.teacher_enabled:
            return
        if teacher_server_configs is None:
            raise ConfigError(
                "teacher_enabled is set but no teacher server is configured; pass "
                "--teacher.base_url (and --teacher.server_type) or a teacher: YAML key"
            )
        if isinstance(teacher_server_configs, APIServerConfig):
            teacher_server_configs = [teacher_server_configs]
        self.teacher_server = ServerManager(teacher_server_configs)
        self.teacher_tokenizer_name = tokenizer_name_of(self.teacher_server.servers[0].config)

    async def setup_teacher(self) -> None:
        """Check the teacher shares the student's vocabulary (same-tokenizer distillation)."""
        if self.teacher_server is None or self.teacher_tokenizer_name in (
            self.config.tokenizer_name, getattr(self.tokenizer, "name_or_path", None)
        ):  # fmt: skip
            return
        teacher_vocab = self.teacher_server.servers[0].tokenizer.get_vocab()
        if teacher_vocab != self.tokenizer.get_vocab():
            raise ConfigError(
                f"the teacher's tokenizer {self.teacher_tokenizer_name!r} differs from the "
                f"student's {self.config.tokenizer_name!r}: only same-tokenizer distillation "
                "is supported"
            )

    async def _fetch_teacher_for_sequence(
        self, token_ids: list[int], top_k: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        assert self.teacher_server is not None
        payload = await self.teacher_server.get_logprobs(
            input_ids=token_ids, top_k=top_k, max_tokens=1, split="train"
        )
        return payload["prompt_topk_token_ids"], payload["prompt_topk_logprobs"]

    async def _attach_teacher_distillation(
        self, group: ScoredDataGroup | ScoredData
    ) -> ScoredDataGroup:
        """Fill the group's distill arrays; on any teacher failure set both to None (logged)."""
        if isinstance(group, ScoredData):
            group = cast(ScoredDataGroup, group.wire())
        if self.teacher_server is None:
            return group
        overrides = group.get("group_overrides") or {}
        top_k = int(overrides.get("teacher_top_k", getattr(self.config, "teacher_top_k", 0)))
        if not self._teacher_checked:
            await self.setup_teacher()
            self._teacher_checked = True
        group["distill_token_ids"] = group["distill_logprobs"] = None
        if not group.get("tokens") or overrides.get("skip_teacher_top_k") or top_k <= -1:
            return group
        fetches = [self._fetch_teacher_for_sequence(seq, max(top_k, 1)) for seq in group["tokens"]]
        results = await asyncio.gather(*fetches, return_exceptions=True)
        ids, logprobs = [], []
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                logger.warning("teacher logprobs of sequence %d failed (%s): group sent "
                               "without distillation data", index, result)  # fmt: skip
                return group
            seq_ids, seq_logprobs = result
            if len(seq_ids) != len(group["tokens"][index]) or len(seq_ids) != len(seq_logprobs):
                logger.warning("teacher logprobs of sequence %d do not align with its tokens: "
                               "group sent without distillation data", index)  # fmt: skip
                return group
            keep = 1 + max(top_k, 0)
            ids.append([row[:keep] for row in seq_ids])
            logprobs.append([row[:keep] for row in seq_logprobs])
        group["distill_token_ids"], group["distill_logprobs"] = ids, logprobs
        return group

    async def run_item(
        self, item: Item, *, max_token_len: int | None = None
    ) -> list[dict[str, Any]]:
        groups = await super().run_item(item, max_token_len=max_token_len)
        return [dict(await self._attach_teacher_distillation(g)) for g in groups]  # type: ignore[arg-type]

    async def handle_send_to_api(
        self,
        scored_data: Trajectories,
        item: Item = None,
        do_send_to_api: bool = True,
        abort_on_any_max_length_exceeded: bool = True,
    ) -> None:
        if isinstance(scored_data, dict | ScoredData):
            scored_data = await self._attach_teacher_distillation(scored_data)
        elif scored_data is not None:
            scored_data = [
                None if g is None else await self._attach_teacher_distillation(g)
                for g in cast(Sequence[ScoredDataGroup | ScoredData | None], scored_data)
            ]
        await super().handle_send_to_api(
            scored_data, item, do_send_to_api, abort_on_any_max_length_exceeded
        )
