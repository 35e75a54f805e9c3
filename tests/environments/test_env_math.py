"""math: math-verify equivalence table, the fixture's splits, ``process`` and ``evaluate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from envcat_testlib import ENVIRONMENTS, load_env_module, process_groups, run_env

from atroposlib.envs.reward_fns.math_rewards import boxed_math_reward

math_env = load_env_module("math")


@pytest.mark.parametrize(
    ("reply", "gold", "score"),
    [
        ("\\boxed{\\frac{3}{4}}", "\\frac{3}{4}", 1.0),  # right
        ("\\boxed{0.75}", "\\frac{3}{4}", 1.0),  # decimal vs fraction
        ("\\boxed{\\dfrac{6}{8}}", "\\frac{3}{4}", 1.0),  # unreduced, dfrac
        ("\\boxed{5\\sqrt{2}}", "\\sqrt{50}", 1.0),  # radicals
        ("\\boxed{28 \\text{ cm}^2}", "28", 1.0),  # units stripped
        ("\\boxed{720^\\circ}", "720", 1.0),  # degrees stripped
        ("\\boxed{1+2x+x^2}", "x^2+2x+1", 1.0),  # algebra
        ("\\boxed{(1,4]}", "(1,4]", 1.0),  # intervals
        ("\\boxed{[1,4]}", "(1,4]", 0.0),  # wrong interval
        ("\\boxed{0.74}", "\\frac{3}{4}", 0.0),  # wrong
        ("The answer is 3/4", "\\frac{3}{4}", 0.0),  # right but not boxed
        ("\\boxed{}", "\\frac{3}{4}", 0.0),  # malformed
        ("", "\\frac{3}{4}", 0.0),  # empty
        ("\\boxed{\\frac{3}{4}} \\boxed{7}", "\\frac{3}{4}", 0.0),  # adversarial: last box counts
        ("\\boxed{x}", "x", 1.0),
        ("\\boxed{" + "(" * 300 + "}", "1", 0.0),  # adversarial: parser bomb
    ],
)
def test_math_reward_table(reply: str, gold: str, score: float) -> None:
    assert boxed_math_reward([reply], [gold]) == [score]


def test_fixture_splits_and_answers_verify_against_themselves() -> None:
    config = math_env.MathConfig(data_path="fixture.jsonl")
    train, test = math_env.load_split(config, "train"), math_env.load_split(config, "test")
    assert len(train) == 12 and len(test) == 4
    for row in train + test:
        answer = math_env.answer_of(row)
        assert boxed_math_reward([f"\\boxed{{{answer}}}"], [answer]) == [1.0]


def test_answer_taken_from_the_solution_box_when_no_answer_field() -> None:
    assert math_env.answer_of({"solution": "so $\\boxed{\\frac{1}{2}}$."}) == "\\frac{1}{2}"


@pytest.mark.slow
def test_math_process_and_evaluate(scripted, tmp_path: Path) -> None:
    rows = [json.loads(x) for x in (ENVIRONMENTS / "math" / "fixture.jsonl").open()]
    rules = [{"when": r["problem"], "replies": [f"\\boxed{{{r['answer']}}}", "\\boxed{-99}"]}
             for r in rows]  # fmt: skip
    server = scripted(rules)
    groups = process_groups("math", server, tmp_path, "--env.data_path=fixture.jsonl",
                            "--env.group_size=2")  # fmt: skip
    assert [g["scores"] for g in groups] == [[1.0, 0.0], [1.0, 0.0]]
    done = run_env("math", "evaluate", server, tmp_path, "--env.data_path=fixture.jsonl",
                   f"--env.data_dir_to_save_evals={tmp_path / 'ev'}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/accuracy"] == 1.0  # eval is greedy: the first scripted reply each time
    asked = {r["messages"][-1]["content"] for r in server.requests() if "messages" in r}
    assert {r["problem"] for r in rows if r["split"] == "test"} <= asked
