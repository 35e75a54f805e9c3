"""A group's ``messages`` / ``extra`` in a shape the typed group does not take cost the field,
never the group: unambiguous shapes are normalised, others set aside with one warning per
field; fields the trainer reads stay strict."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.optional_fields import (
    BARE_TEXT,
    ONE_CONVERSATION,
    ONE_OBJECT,
    ONE_STRING,
    repair_optional_fields,
)

SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "2+2?"}
REPLY_A = {"role": "assistant", "content": "4"}
REPLY_B = {"role": "assistant", "content": "5"}


def text(content: str) -> dict[str, str]:
    return {"role": "text", "content": content}


def group(size: int = 2, **fields: Any) -> dict[str, Any]:
    return {
        "tokens": [[1, 2 + i] for i in range(size)],
        "masks": [[-100, 2 + i] for i in range(size)],
        "scores": [float(i % 2) for i in range(size)],
        **fields,
    }


NORMALISED = [
    pytest.param(
        "messages", [SYSTEM, USER], 2, [[SYSTEM, USER], [SYSTEM, USER]], ONE_CONVERSATION,
        id="flat conversation, roles differ",
    ),
    pytest.param(
        "messages", [SYSTEM, USER, REPLY_A], 2, [[SYSTEM, USER, REPLY_A]] * 2, ONE_CONVERSATION,
        id="flat conversation longer than the group",
    ),
    pytest.param("messages", [USER], 1, [[USER]], ONE_CONVERSATION, id="one message, group of 1"),
    pytest.param(
        "messages", ["User: 2+2?\n---\nAssistant: 4", "User: 2+2?\n---\nAssistant: 5"], 2,
        [[text("User: 2+2?\n---\nAssistant: 4")], [text("User: 2+2?\n---\nAssistant: 5")]],
        BARE_TEXT, id="one string per sequence (lean_proof_env)",
    ),
    pytest.param(
        "messages", [["hi", REPLY_A], ["hi", REPLY_B]], 2,
        [[text("hi"), REPLY_A], [text("hi"), REPLY_B]], BARE_TEXT,
        id="per-sequence turns, some bare strings",
    ),
    pytest.param(
        "messages", "the whole transcript", 3, [[text("the whole transcript")]] * 3, ONE_STRING,
        id="one string for the group",
    ),
    pytest.param(
        "extra", {"problem": "p1"}, 2, [{"problem": "p1"}, {"problem": "p1"}], ONE_OBJECT,
        id="extra: one object for the group",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "size", "expected", "how"), NORMALISED)
def test_unambiguous_shapes_become_one_entry_per_sequence(
    name: str, value: Any, size: int, expected: Any, how: str
) -> None:
    repaired = repair_optional_fields(group(size, **{name: value}))
    assert repaired is not None
    assert repaired.group[name] == expected
    assert repaired.normalised == [(name, how)] and repaired.set_aside == []


SET_ASIDE = [
    pytest.param("messages", [REPLY_A, REPLY_B], "a list of 2 dict",
                 id="G same-role messages: one reply each, or one conversation?"),
    pytest.param("messages", ["only one of two"], "a list of 1 str", id="strings, wrong count"),
    pytest.param("messages", [[SYSTEM]], "a list of 1 list", id="conversations, wrong count"),
    pytest.param("messages", [{"text": "no role"}] * 3, "a list of 3 dict", id="not messages"),
    pytest.param("messages", {"role": "user", "content": "x"}, "dict", id="a bare message"),
    pytest.param("messages", [[1, 2], [3]], "a list of 2 list", id="numbers"),
    pytest.param("extra", 7, "int", id="extra: a number"),
    pytest.param("extra", [{"a": 1}], "a list of 1 dict", id="extra: wrong count"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value", "shape"), SET_ASIDE)
def test_ambiguous_or_foreign_shapes_are_set_aside(name: str, value: Any, shape: str) -> None:
    repaired = repair_optional_fields(group(2, **{name: value}))
    assert repaired is not None
    assert name not in repaired.group and repaired.group["tokens"] == group(2)["tokens"]
    assert repaired.set_aside == [(name, shape)] and repaired.normalised == []


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"messages": None, "extra": None},
        {"messages": []},
        {"messages": [[USER, REPLY_A], [USER, REPLY_B]], "extra": [{}, {"k": [1]}]},
        {"advantages": [[1.0]]},  # a strict field's fault: not for this repair
    ],
)
def test_nothing_to_repair(fields: dict[str, Any]) -> None:
    assert repair_optional_fields(group(2, **fields)) is None


class Env(BaseEnv):
    async def get_next_item(self) -> Any:
        return None

    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        return None, []


def make_env() -> Env:
    return Env(BaseEnvConfig(group_size=2, use_wandb=False), [], testing=True)


@pytest.mark.parametrize("max_token_len", [None, -1], ids=["serve", "process"])
def test_the_env_keeps_the_group_in_serve_and_process(max_token_len: int | None) -> None:
    env = make_env()
    flat = group(2, messages=[SYSTEM, USER], item_uuid="u1")
    (sent,) = env.accept_groups(flat, max_token_len=max_token_len)
    assert sent["messages"] == [[SYSTEM, USER], [SYSTEM, USER]]
    assert sent["tokens"] == flat["tokens"] and sent["scores"] == flat["scores"]


def test_set_aside_warns_once_per_field_per_run(caplog: pytest.LogCaptureFixture) -> None:
    env = make_env()
    with caplog.at_level(logging.INFO, logger="atroposlib.envs.optional_fields"):
        for _ in range(3):
            (sent,) = env.accept_groups(group(2, messages=[REPLY_A, REPLY_B], extra=7))
            assert "messages" not in sent and "extra" not in sent
        env.accept_groups(group(2, messages=[SYSTEM, USER]))
        env.accept_groups(group(2, messages=[SYSTEM, USER]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert (
        "'messages' set aside: expected one list of {role, content} messages per sequence, "
        "got a list of 2 dict" in warnings[0]
    )
    assert "'extra' set aside: expected one JSON object per sequence, got int" in warnings[1]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == [f"group field 'messages' is {ONE_CONVERSATION} (said once)"]
    assert make_env().repair_notices.told == set()  # per run: a new env says it again


@pytest.mark.parametrize(
    ("strict", "reason"),
    [
        ({"advantages": [[1.0, 1.0]]}, "advantages has 1 sequences, tokens has 2"),
        ({"inference_logprobs": [[0.0], [0.0, 0.0]]}, "inference_logprobs[0] has 1 values"),
        ({"scores": [1.0]}, "tokens has 2 sequences but scores has 1"),
        ({"overrides": {"sft": True}}, "overrides: Input should be a valid list"),
        ({"generation_params": ["t", 1.0]}, "generation_params: Input should be a valid dict"),
    ],
)
def test_fields_the_trainer_reads_stay_strict(
    strict: dict[str, Any], reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = make_env()
    with caplog.at_level(logging.WARNING):
        assert env.accept_groups({**group(2, messages=[SYSTEM, USER]), **strict}) == []
    assert reason in env.last_failure, env.last_failure  # type: ignore[operator]
    assert env.repair_notices.told == set()  # a rejected group announces no repair
