"""GSM8K: the reward table, the shipped fixture, and ``process`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from envcat_testlib import ENVIRONMENTS, process_groups, run_env

from atroposlib.envs.reward_fns.answers import extract_final_number
from atroposlib.envs.reward_fns.math_rewards import gsm8k_reward

FIXTURE = ENVIRONMENTS / "gsm8k" / "fixture.jsonl"


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Step 1 ... so \\boxed{72}", 1.0),  # right, boxed
        ("48 + 24 = 72", 1.0),  # right, last number
        ("#### 72", 1.0),  # right, GSM8K mark
        ("\\boxed{72.00}", 1.0),  # right, another spelling
        ("The total is 72 dollars.", 1.0),  # units around it
        ("\\boxed{71}", 0.0),  # wrong
        ("72 is wrong, it's 70", 0.0),  # last number wins
        ("\\boxed{}", 0.0),  # malformed: empty box, no number elsewhere
        ("\\boxed{seventy-two}", 0.0),  # malformed: words
        ("", 0.0),  # empty
        ("<think>the answer is 72</think>I give up", 0.0),  # adversarial: answer only in thinking
        ("\\boxed{72" + "}" * 50, 1.0),  # adversarial: stray braces still one box
        ("1" * 5000, 0.0),  # adversarial: a huge number
    ],
)
def test_gsm8k_reward_table(reply: str, score: float) -> None:
    assert gsm8k_reward([reply], ["48 + 24 = <<48+24=72>>72\n#### 72"]) == [score]


def test_shipped_fixture_has_the_gsm8k_shape() -> None:
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    assert len(rows) == 20
    for row in rows:
        assert set(row) == {"question", "answer"}
        assert "####" in row["answer"]
        assert extract_final_number(row["answer"]) is not None


@pytest.mark.slow
def test_process_scores_scripted_answers(scripted, tmp_path: Path) -> None:
    data = tmp_path / "two.jsonl"
    rows = [{"question": "What is 20 + 7?", "answer": "20 + 7 = 27\n#### 27"}] * 2
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    replies = ["So \\boxed{27}", "20 + 7 = 27", "The answer is 26.", ""]
    server = scripted([{"when": "20 + 7", "replies": replies}])
    groups = process_groups("gsm8k", server, tmp_path, f"--env.data_path={data}",
                            "--env.group_size=4")  # fmt: skip
    assert [g["scores"] for g in groups] == [[1.0, 1.0, 0.0, 0.0]] * 2
    for group in groups:
        assert group["messages"][0][0]["role"] == "system"
        assert group["messages"][0][-1] == {"role": "assistant", "content": "So \\boxed{27}"}
        assert len(group["tokens"]) == len(group["masks"]) == 4
    assert all(r["sampling_params"]["n"] == 4 for r in server.requests())


@pytest.mark.slow
def test_evaluate_reports_accuracy_on_the_fixture(scripted, tmp_path: Path) -> None:
    server = scripted([{"when": "pencils", "replies": ["\\boxed{27}"]},
                       {"when": "", "replies": ["no idea"]}])  # fmt: skip
    done = run_env("gsm8k", "evaluate", server, tmp_path, "--env.data_path=fixture.jsonl",
                   f"--env.data_dir_to_save_evals={tmp_path / 'ev'}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert metrics["results"]["all"]["eval/accuracy"] == pytest.approx(1 / 20)
