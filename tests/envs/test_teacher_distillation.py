"""Teacher distillation: teacher server resolution, the tokenizer check, the distill arrays."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from atroposlib.envs.server_handling.openai_server import resolve_openai_configs
from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
from atroposlib.envs.teacher_distillation_env import (
    TeacherConfigError,
    TeacherDistillationConfig,
    TeacherDistillationEnv,
)
from atroposlib.errors import ConfigError

UNREACHABLE = "http://127.0.0.1:9/v1"


class TeacherEnv(TeacherDistillationEnv):
    async def get_next_item(self) -> None:
        return None

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None


# ---- resolve_openai_configs: the layered settings of the inference servers ---------------


def server(url: str, **extra: Any) -> APIServerConfig:
    return APIServerConfig(base_url=url, **extra)


def test_one_server_comes_from_the_merged_settings() -> None:
    merged = {**server("http://a/v1").model_dump(), "timeout": 7}
    one = resolve_openai_configs(server("http://a/v1"), merged, {}, {})
    assert isinstance(one, APIServerConfig) and one.timeout == 7
    as_list = resolve_openai_configs([server("http://a/v1")], merged, {}, {})
    assert isinstance(as_list, list) and [s.timeout for s in as_list] == [7]
    assert isinstance(resolve_openai_configs(None, {"base_url": "http://b/v1"}, {}, {}), list)


def test_several_servers_stay_several_and_flags_apply_to_each() -> None:
    yaml = {"openai": [{"base_url": "http://a/v1"}, {"base_url": "http://b/v1"}]}
    flags = {"openai.timeout": 5, "env.group_size": 2}
    servers = resolve_openai_configs(server("http://x/v1"), {}, yaml, flags)
    assert isinstance(servers, list)
    assert [(s.base_url, s.timeout) for s in servers] == [("http://a/v1", 5), ("http://b/v1", 5)]
    defaults = [server("http://c/v1"), server("http://d/v1")]
    servers = resolve_openai_configs(defaults, {}, {}, {"openai.model_name": "m"})
    assert isinstance(servers, list) and [s.model_name for s in servers] == ["m", "m"]


def test_a_bare_server_baseline_is_kept_for_discovery() -> None:
    baseline = ServerBaseline(timeout=9)
    assert resolve_openai_configs(baseline, {}, {}, {}) is baseline


@pytest.mark.parametrize(
    ("merged", "yaml", "message"),
    [
        ({"timeout": -1}, {}, "openai.timeout: Input should be greater than 0"),
        ({}, {"openai": [{"base_url": "http://a/v1"}, "b"]}, r"openai\[1\] must be a mapping"),
    ],
)
def test_unusable_settings_name_the_field(merged: dict, yaml: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_openai_configs(server("http://a/v1"), merged, yaml, {})


# ---- the teacher namespace ---------------------------------------------------------------


def test_no_teacher_anywhere_means_none() -> None:
    assert TeacherEnv._resolve_teacher_server_configs(None, {"openai": {}}, {"openai.x": 1}) is None


def test_teacher_flags_over_yaml_over_the_default() -> None:
    default = server("http://teacher/v1", model_name="t", timeout=30)
    yaml = {"teacher": {"model_name": "from-yaml", "timeout": 40}, "openai": {"timeout": 1}}
    flags = {"teacher.timeout": 50, "openai.timeout": 2}
    resolved = TeacherEnv._resolve_teacher_server_configs(default, yaml, flags)
    assert isinstance(resolved, APIServerConfig)
    assert (resolved.base_url, resolved.model_name, resolved.timeout) == (
        "http://teacher/v1", "from-yaml", 50,
    )  # fmt: skip


def test_teacher_flags_alone_make_a_teacher_and_a_baseline_default_takes_them() -> None:
    resolved = TeacherEnv._resolve_teacher_server_configs(
        None, {}, {"teacher.base_url": "http://t/v1"}
    )
    assert isinstance(resolved, APIServerConfig) and resolved.base_url == "http://t/v1"
    baseline = ServerBaseline(model_name="teacher-model")
    resolved = TeacherEnv._resolve_teacher_server_configs(
        baseline, {}, {"teacher.base_url": "http://t/v1"}
    )
    assert isinstance(resolved, APIServerConfig)
    assert (resolved.base_url, resolved.model_name) == ("http://t/v1", "teacher-model")
    two = {"teacher": [{"base_url": "http://t1/v1"}, {"base_url": "http://t2/v1"}]}
    resolved = TeacherEnv._resolve_teacher_server_configs(None, two, {})
    assert isinstance(resolved, list) and [s.base_url for s in resolved] == [
        "http://t1/v1", "http://t2/v1",
    ]  # fmt: skip


# ---- building the env: a teacher is required, and must share the student's tokenizer ------


def build(teacher: Any, student_tokenizer: Path) -> TeacherEnv:
    config = TeacherDistillationConfig(
        teacher_enabled=True, use_wandb=False, tokenizer_name=str(student_tokenizer)
    )
    return TeacherEnv(config, [server(UNREACHABLE)], teacher_server_configs=teacher)


def test_teacher_enabled_without_a_teacher_is_refused(test_model_path: Path) -> None:
    with pytest.raises(TeacherConfigError, match="no teacher server configuration was provided"):
        build(None, test_model_path)
    assert issubclass(TeacherConfigError, ConfigError) and issubclass(
        TeacherConfigError, ValueError
    )


@pytest.fixture(scope="module")
def tokenizer_copies(
    tmp_path_factory: pytest.TempPathFactory, test_model_path: Path
) -> tuple[Path, Path]:
    """The test model's tokenizer saved elsewhere as is, and with one token more."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("tokenizers")
    same, other = folder / "same", folder / "other"
    AutoTokenizer.from_pretrained(test_model_path).save_pretrained(same)
    grown = AutoTokenizer.from_pretrained(test_model_path)
    grown.add_tokens(["<teacher-only>"])
    grown.save_pretrained(other)
    return same, other


@pytest.mark.slow  # loads the real tokenizer four times
def test_the_teacher_must_have_the_students_vocabulary(
    tokenizer_copies: tuple[Path, Path], test_model_path: Path
) -> None:
    same, other = tokenizer_copies
    env = build(server(UNREACHABLE, tokenizer_name=str(same)), test_model_path)
    assert env.teacher_server is not None and env.teacher_tokenizer_name == str(same)
    with pytest.raises(TeacherConfigError, match="Cross-tokenizer distillation is not supported: "):
        build([server(UNREACHABLE, tokenizer_name=str(other))], test_model_path)
    with pytest.raises(TeacherConfigError, match="could not be loaded"):
        build(server(UNREACHABLE, tokenizer_name=str(other / "missing")), test_model_path)


# ---- the distill arrays ------------------------------------------------------------------


class FakeTeacher:
    """Answers prompt logprobs: at each position the token, then k made-up alternatives."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.top_ks: list[int] = []

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        self.top_ks.append(kwargs["top_k"])
        if self.fail:
            raise ConnectionError("teacher down")
        ids, k = kwargs["input_ids"], kwargs["top_k"]
        return {
            "prompt_tokens": ids,
            "prompt_topk_token_ids": [[t, *range(100, 100 + k)] for t in ids],
            "prompt_topk_logprobs": [[-0.5, *[-1.0] * k] for _ in ids],
        }


def env_with(teacher: FakeTeacher, top_k: int) -> TeacherEnv:
    env = object.__new__(TeacherEnv)
    env.config = TeacherDistillationConfig(teacher_enabled=True, teacher_top_k=top_k)
    env.teacher_server = teacher  # type: ignore[assignment]
    return env


def group(**extra: Any) -> dict[str, Any]:
    return {"tokens": [[1, 2, 3], [4, 5]], "masks": [[-100, 2, 3], [-100, 5]],
            "scores": [1.0, 0.0], **extra}  # fmt: skip


async def test_each_position_gets_the_token_then_top_k() -> None:
    teacher = FakeTeacher()
    out = await env_with(teacher, 2)._attach_teacher_distillation(group())  # type: ignore[arg-type]
    assert out["distill_token_ids"] == [
        [[1, 100, 101], [2, 100, 101], [3, 100, 101]], [[4, 100, 101], [5, 100, 101]],
    ]  # fmt: skip
    assert out["distill_logprobs"][1] == [[-0.5, -1.0, -1.0]] * 2
    assert teacher.top_ks == [2, 2]


async def test_top_k_zero_keeps_the_sampled_token_and_overrides_win() -> None:
    teacher = FakeTeacher()
    env = env_with(teacher, 0)
    out = await env._attach_teacher_distillation(group())  # type: ignore[arg-type]
    assert out["distill_token_ids"][0] == [[1], [2], [3]]
    out = await env._attach_teacher_distillation(group(group_overrides={"teacher_top_k": 3}))  # type: ignore[arg-type]
    assert len(out["distill_token_ids"][0][0]) == 4
    calls = len(teacher.top_ks)
    for overrides, top_k in (({"skip_teacher_top_k": True}, 2), (None, -1)):
        out = await env_with(teacher, top_k)._attach_teacher_distillation(
            group(group_overrides=overrides)  # type: ignore[arg-type]
        )
        assert out["distill_token_ids"] is None and out["distill_logprobs"] is None
    assert len(teacher.top_ks) == calls, "no teacher call when skipped"


async def test_a_teacher_failure_sends_the_group_without_distillation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        out = await env_with(FakeTeacher(fail=True), 2)._attach_teacher_distillation(group())  # type: ignore[arg-type]
    assert out["distill_token_ids"] is None and out["distill_logprobs"] is None
    assert out["scores"] == [1.0, 0.0]
    assert "teacher logprobs of sequence 0 failed (teacher down)" in caplog.text
