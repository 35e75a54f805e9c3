"""On-policy distillation (Atropos's last feature): groups carry a teacher's view of the
student's own tokens.

``TeacherDistillationEnv`` asks a second inference server (the teacher: vLLM, SGLang or our
embedded server, any that returns prompt logprobs) to score every sampled sequence as a
prompt, and fills each group's ``distill_token_ids`` / ``distill_logprobs``
(``[sequence][position][k]``): at each position the student's token first, then the
teacher's other top-k tokens, with the teacher's logprobs. Position 0 has none. The teacher
must share the student's tokenizer (token ids are passed as they are).

Teacher servers come from ``teacher_config_init()``, ``--teacher.<field>`` flags or a
``teacher:`` YAML key, in every command (Atropos wired them for ``serve`` only), or
``teacher_server_configs=`` when the env is built in code; the tokenizers are compared when
the env is built.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC
from collections.abc import Mapping, Sequence
from typing import Any, cast

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup, Trajectories
from atroposlib.envs.constants import ENV_NAMESPACE, NAMESPACE_SEP, OPENAI_NAMESPACE
from atroposlib.envs.server_handling.openai_server import resolve_openai_configs
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
    "TeacherConfigError",
    "TeacherDistillationConfig",
    "TeacherDistillationEnv",
    "resolve_openai_configs",
]

TeacherConfigs = ServerBaseline | APIServerConfig | list[APIServerConfig]


class TeacherConfigError(ConfigError, ValueError):
    """Teacher settings that cannot work (a ValueError too, as Atropos raised)."""


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

    @classmethod
    def _resolve_teacher_server_configs(
        cls,
        default_teacher_server_configs: TeacherConfigs | None,
        yaml_config: Mapping[str, Any],
        cli_passed_flags: Mapping[str, Any],
    ) -> TeacherConfigs | None:
        """The teacher servers from the ``teacher`` namespace (YAML key and ``teacher.*``
        flags) over ``default_teacher_server_configs``, resolved like the ``openai`` ones;
        None when none of the three names a teacher."""
        prefix = f"{cls.teacher_namespace}{NAMESPACE_SEP}"
        flags = {k.removeprefix(prefix): v for k, v in cli_passed_flags.items()
                 if k.startswith(prefix)}  # fmt: skip
        from_yaml = yaml_config.get(cls.teacher_namespace) or {}
        default = default_teacher_server_configs
        if default is None and not flags and not from_yaml:
            return None
        if default is None or (type(default) is ServerBaseline and (flags or from_yaml)):
            default = APIServerConfig(**default.model_dump()) if default else APIServerConfig()
        single = default[0] if isinstance(default, list) and len(default) == 1 else default
        if isinstance(from_yaml, list) and len(from_yaml) == 1:
            from_yaml = from_yaml[0]
        merged: dict[str, Any] = {}
        if isinstance(single, APIServerConfig) and isinstance(from_yaml, Mapping):
            merged = {**single.model_dump(), **from_yaml, **flags}
        return resolve_openai_configs(
            default_server_configs=default,
            openai_config_dict=merged,
            yaml_config={OPENAI_NAMESPACE: from_yaml},
            cli_passed_flags={f"{OPENAI_NAMESPACE}{NAMESPACE_SEP}{k}": v for k, v in flags.items()},
            logger=logger,
        )

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
        if not config.teacher_enabled:
            return
        if teacher_server_configs is None:
            raise TeacherConfigError(
                "teacher_enabled is set but no teacher server configuration was provided; "
                "pass --teacher.base_url (and --teacher.server_type), a teacher: YAML key, "
                "or teacher_server_configs=... when building the env in code"
            )
        if isinstance(teacher_server_configs, APIServerConfig):
            teacher_server_configs = [teacher_server_configs]
        self.teacher_server = ServerManager(teacher_server_configs)
        first = teacher_server_configs
        if isinstance(first, list):
            first = first[0]
        self.teacher_tokenizer_name = tokenizer_name_of(first)
        self._validate_teacher_tokenizer_compatibility(self.teacher_tokenizer_name)

    def _validate_teacher_tokenizer_compatibility(self, teacher_tokenizer_name: str) -> None:
        """Same-tokenizer distillation only: the teacher reads the student's token ids as they
        are, so both tokenizers must have one vocabulary (compared unless the names match)."""
        student = self.tokenizer
        student_name = getattr(student, "name_or_path", None) or type(student).__name__
        if student_name == teacher_tokenizer_name:
            return
        from transformers import AutoTokenizer

        try:
            teacher = AutoTokenizer.from_pretrained(teacher_tokenizer_name)
        except (OSError, ValueError) as exc:
            raise TeacherConfigError(
                "Cross-tokenizer distillation is not supported, and the teacher's tokenizer "
                f"{teacher_tokenizer_name!r} could not be loaded to compare it with the "
                f"student's: {exc}"
            ) from exc
        if teacher.get_vocab() != student.get_vocab():
            raise TeacherConfigError(
                "Cross-tokenizer distillation is not supported: the teacher's tokenizer "
                f"{teacher_tokenizer_name!r} and the student's {student_name!r} have different "
                "vocabularies; serve a teacher that uses the student's tokenizer"
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
        self,
        item: Item,
        *,
        max_token_len: int | None = None,
        dropped: list[dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        groups = await super().run_item(item, max_token_len=max_token_len, dropped=dropped)
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
