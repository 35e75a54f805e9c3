"""openai_agent: safe tools, the reward, and ``process`` with the agent driving the proxy."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from envcat_testlib import load_env_module, process_groups, trained_spans

agent_env = load_env_module("openai_agent")


@pytest.mark.parametrize(
    ("name", "arguments", "answer"),
    [
        ("calculate", {"expression": "2 * (3 + 4) - 1"}, "13"),
        ("calculate", {"expression": "7 / 2"}, "3.5"),
        ("calculate", {"expression": "-4 + 1"}, "-3"),
        ("calculate", {"expression": "2 ** 200"}, "error: only numbers"),  # no powers
        ("calculate", {"expression": "().__class__"}, "error: only numbers"),
        ("calculate", {"expression": "open('/etc/passwd')"}, "error: only numbers"),
        ("calculate", {"expression": "1 / 0"}, "error: float division by zero"),
        ("calculate", {"expression": "9" * 20 + "*" + "9" * 20}, "error: the result is too"),
        ("calculate", {"expression": "1+" * 150 + "1"}, "error: the expression is longer"),
        ("calculate", {"expression": "3 +"}, "error: invalid syntax"),
        ("price", {"item": " Notebook "}, "3"),
        ("price", {"item": "laptop"}, "error: unknown item 'laptop'"),
        ("price", {}, "error: unknown item ''"),
        ("search", {"q": "x"}, "error: no tool named 'search'"),
    ],
)
def test_tools_answer_or_explain_never_eval(name: str, arguments: dict, answer: str) -> None:
    assert agent_env.run_tool(name, json.dumps(arguments)).startswith(answer)


HOSTILE_ARGUMENTS = [
    "[" * 100_000 + "]" * 100_000,
    '{"a":' * 100_000 + "1" + "}" * 100_000,
    '{"expression": "' + "1" * (10 << 20) + '"}',
    '{"expression": "\\ud800"}',
]


@pytest.mark.parametrize(
    "arguments", ['{"expression": ', "[1, 2]", '"7*3"', "null", "", *HOSTILE_ARGUMENTS]
)
def test_tool_arguments_that_are_not_a_json_object(arguments: str) -> None:
    expected = "error: the arguments are not a JSON object"
    assert agent_env.run_tool("calculate", arguments) == expected


def test_reward_reads_the_last_reply_and_counts_a_tool_that_ran() -> None:
    reward = agent_env.agent_reward
    answered = {"role": "assistant", "content": "So <answer>17</answer>"}
    ok, failed = {"role": "tool", "content": "3"}, {"role": "tool", "content": "error: x"}
    assert reward([ok, answered], 17) == 1.2
    assert reward([failed, answered], 17) == 1.0
    assert reward([ok, answered], 18) == 0.2
    assert reward([answered, ok], 17) == 1.2  # the last assistant reply, after its tool call
    assert reward([{"role": "assistant", "content": "17"}], 17) == 0.0  # no tag


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.mark.slow
def test_process_runs_the_openai_agent_through_the_proxy_token_exactly(
    scripted, tmp_path: Path
) -> None:
    item = agent_env.make_question(random.Random(0))
    answer = f"<answer>{item['answer']}</answer>"
    server = scripted([{"when": "A class buys", "replies": [
        call("price", item="notebook"), call("calculate", expression="3*2"), answer,
    ]}])  # fmt: skip
    [group] = process_groups("openai_agent", server, tmp_path, "--env.group_size=2",
                             "--env.max_turns=3", "--env.ensure_scores_are_not_same=false",
                             steps=1)  # fmt: skip
    assert len(group["tokens"]) == 2
    for tokens, masks, chat, score in zip(
        group["tokens"], group["masks"], group["messages"], group["scores"], strict=True
    ):
        replies = [m for m in chat if m["role"] == "assistant"]
        assert len(trained_spans(tokens, masks)) == len(replies), "one node, every turn trained"
        assert [m["role"] for m in chat[:2]] == ["system", "user"]
        tool_ran = any(m["role"] == "tool" and not m["content"].startswith("error") for m in chat)
        answered = replies[-1]["content"] == answer
        assert score == pytest.approx(float(answered) + 0.2 * tool_ran)
    assert group["generation_params"]["temperature"] == 1.0
    assert group["policy_versions"] is not None
