"""tool_calling: exact matching with normalisation, single- and multi-turn ``process``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from envcat_testlib import ENVIRONMENTS, load_env_module, process_groups

from atroposlib.envs.reward_fns.tool_call_rewards import parse_tool_calls, tool_call_match_reward

tool_env = load_env_module("tool_calling")
WEATHER = [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]
PARALLEL = [{"name": "get_weather", "arguments": {"city": "Oslo"}},
            {"name": "get_weather", "arguments": {"city": "Rome"}}]  # fmt: skip


def call(payload: object) -> str:
    return f"<tool_call>{json.dumps(payload)}</tool_call>"


@pytest.mark.parametrize(
    ("reply", "expected", "score"),
    [
        (call(WEATHER[0]), WEATHER, 1.0),  # exact
        (
            call({"arguments": {"unit": "celsius", "city": "Paris"}, "name": "get_weather"}),
            WEATHER,
            1.0,
        ),
        (
            call({"name": "get_weather", "arguments": json.dumps(WEATHER[0]["arguments"])}),
            WEATHER,
            1.0,
        ),
        (
            call({"name": " get_weather ", "arguments": {"city": " Paris ", "unit": "celsius"}}),
            WEATHER,
            1.0,
        ),
        ("Sure!\n" + call(WEATHER[0]) + "\nDone.", WEATHER, 1.0),  # text around the call
        (call({"function": WEATHER[0]}), WEATHER, 1.0),  # OpenAI's nested shape
        (
            call({"name": "get_weather", "arguments": {"city": "paris", "unit": "celsius"}}),
            WEATHER,
            0.0,
        ),
        (
            call({"name": "get_weather", "arguments": {"city": "Paris"}}),
            WEATHER,
            0.0,
        ),  # missing arg
        (
            call({"name": "get_weather", "arguments": {**WEATHER[0]["arguments"], "x": 1}}),
            WEATHER,
            0.0,
        ),
        (call(WEATHER[0]) * 2, WEATHER, 0.0),  # called twice
        (call(PARALLEL[1]) + call(PARALLEL[0]), PARALLEL, 1.0),  # parallel, any order
        (call(PARALLEL[0]), PARALLEL, 0.0),  # one of two
        ("<tool_call>{'name': 'get_weather'}</tool_call>", WEATHER, -0.5),  # not JSON
        ("<tool_call>[1, 2]</tool_call>", WEATHER, -0.5),  # JSON but not a call
        (call({"arguments": {}}), WEATHER, -0.5),  # no name
        ("It is sunny in Paris.", WEATHER, 0.0),  # no call
        ("", WEATHER, 0.0),  # empty
        ("Hello!", [], 1.0),  # no call expected, none made
        (call(WEATHER[0]), [], 0.0),  # a call where none is expected
        (
            call({"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}})
            + "<tool_call>{broken",
            WEATHER,
            1.0,
        ),  # an unclosed block is not a call
    ],
)
def test_tool_call_reward_table(reply: str, expected: list, score: float) -> None:
    assert tool_call_match_reward([reply], [expected]) == [score]


def test_numbers_normalise_but_types_do_not_blur() -> None:
    assert parse_tool_calls(call({"name": "f", "arguments": {"n": 2.0}})) == parse_tool_calls(
        call({"name": "f", "arguments": {"n": 2}})
    )
    assert parse_tool_calls(call({"name": "f", "arguments": {"n": "2"}})) != parse_tool_calls(
        call({"name": "f", "arguments": {"n": 2}})
    )


def test_fixture_expected_calls_score_one_against_themselves() -> None:
    rows = tool_env.load_rows("fixture.jsonl")
    assert len(rows) == 7 and any(len(r["turns"]) > 1 for r in rows)
    for row in rows:
        for turn in row["turns"]:
            reply = "".join(call(c) for c in turn["expected_calls"]) or "No tool needed."
            assert tool_call_match_reward([reply], [turn["expected_calls"]]) == [1.0]


@pytest.mark.slow
def test_tool_calling_process_single_and_multi_turn(scripted, tmp_path: Path) -> None:
    rows = {
        r["id"]: r for r in tool_env.load_rows(str(ENVIRONMENTS / "tool_calling/fixture.jsonl"))
    }
    data = tmp_path / "two.jsonl"
    data.write_text(json.dumps(rows["weather-1"]) + "\n" + json.dumps(rows["flight-2turn"]) + "\n")
    search, book = (t["expected_calls"][0] for t in rows["flight-2turn"]["turns"])
    server = scripted([
        {"when": "Paris", "replies": [call(rows["weather-1"]["turns"][0]["expected_calls"][0]),
                                      "<tool_call>{oops</tool_call>"]},
        {"when": "Find flights", "replies": [call(search), call({**search, "arguments": {}})]},
        {"when": "Book the cheapest", "replies": [call(book)]},
    ])  # fmt: skip
    groups = process_groups("tool_calling", server, tmp_path, f"--env.data_path={data}",
                            "--env.group_size=2")  # fmt: skip
    by_kind = {len(g["messages"][0]): g for g in groups}
    single, multi = by_kind[3], by_kind[6]
    assert single["scores"] == [1.0, -0.5]
    assert sorted(multi["scores"]) == [0.5, 1.0]
    roles = [m["role"] for m in multi["messages"][0]]
    assert roles == ["system", "user", "assistant", "tool", "user", "assistant"]
    trained = [t for t in multi["masks"][0] if t != -100]
    assert 0 < len(trained) < len(multi["tokens"][0])
