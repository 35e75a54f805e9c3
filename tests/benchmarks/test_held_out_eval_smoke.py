"""benchmarks/held_out_eval.py on a few problems: ``env.py evaluate`` as atropos-local runs it,
against a server with the old prefill, one sharing the prompts' beginning in batches of 4 rows,
and one sharing it with every problem in one batch, gives the same greedy replies (real test
model, real server processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.held_out_eval import evaluate, parse_args, replies


@pytest.mark.slow
@pytest.mark.model
def test_the_evaluator_answers_the_same_with_a_shared_prompt_beginning_and_in_one_batch(
    tmp_path: Path, test_model_path: Path, subprocess_env: dict[str, str]
) -> None:
    """Three evaluations of the same 12 problems (one server and one env process each; the
    two comparisons once had their own test each, four evaluations): the old prefill with the
    default batch; the shared beginning with a server batch of 4 rows and 4 requests at once
    (``--compare prefill``); the shared beginning with all 12 in one batch (``--compare batch``,
    learning_vs_trl.py's evaluator)."""
    args = parse_args(["--eval-size", "12"])
    model = str(test_model_path)
    old = evaluate(model, tmp_path / "old", args, share=False, env=subprocess_env)
    small = evaluate(model, tmp_path / "small", args, share=True, env=subprocess_env, batch=4)
    evaluate(model, tmp_path / "whole", args, share=True, env=subprocess_env, batch=12)
    before, shared = replies(tmp_path / "old"), replies(tmp_path / "small")
    assert len(before) == 12 and old > 0 and small > 0
    assert shared == before, "the shared beginning in batches of 4 answered otherwise"
    assert len(set(shared.values())) > 1
    assert replies(tmp_path / "whole") == shared, "one batch of 12 answered otherwise than 4s"
