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
