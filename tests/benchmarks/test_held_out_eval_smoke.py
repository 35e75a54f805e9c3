"""benchmarks/held_out_eval.py on a few problems: ``env.py evaluate`` as atropos-local runs it,
against a server with the old prefill and one sharing the prompts' beginning, gives the same
greedy replies (real test model, real server processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.held_out_eval import evaluate, parse_args, replies


@pytest.mark.slow
@pytest.mark.model
def test_the_evaluator_answers_the_same_with_the_shared_prompt_beginning(
    tmp_path: Path, test_model_path: Path, subprocess_env: dict[str, str]
) -> None:
    args = parse_args(["--eval-size", "12"])
    model = str(test_model_path)
    old = evaluate(model, tmp_path / "old", args, share=False, env=subprocess_env)
    new = evaluate(model, tmp_path / "new", args, share=True, env=subprocess_env)
    before, after = replies(tmp_path / "old"), replies(tmp_path / "new")
    assert len(before) == 12 and old > 0 and new > 0
    assert after == before
    assert len(set(after.values())) > 1


@pytest.mark.slow
@pytest.mark.model
def test_the_evaluator_answers_the_same_with_every_problem_in_one_batch(
    tmp_path: Path, test_model_path: Path, subprocess_env: dict[str, str]
) -> None:
    """``--compare batch``: a server batch of 4 rows with 4 requests at once against one batch
    of all 12 problems (learning_vs_trl.py's evaluator) gives the same greedy replies."""
    args = parse_args(["--eval-size", "12", "--compare", "batch"])
    model = str(test_model_path)
    evaluate(model, tmp_path / "small", args, share=True, env=subprocess_env, batch=4)
    evaluate(model, tmp_path / "whole", args, share=True, env=subprocess_env, batch=12)
    small, whole = replies(tmp_path / "small"), replies(tmp_path / "whole")
    assert len(small) == 12 and whole == small
