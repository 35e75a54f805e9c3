"""What ``atropos-local --eval-size N`` asks of an environment, so that any env can take part.

Before and after training, atropos-local runs ``env.py evaluate --env.eval_size N
--env.data_dir_to_save_evals <run>/eval_<label>`` and compares the two ``samples.jsonl``
problem by problem (:mod:`atroposlib.localrun.report`). An env takes part with:

- a config that has ``eval_size`` (subclass :class:`HeldOutEvalConfig`);
- an ``evaluate()`` that answers ``eval_size`` problems the trainer can never be given (split
  them off with :mod:`atroposlib.envs.heldout`) and passes one :func:`graded_sample` per
  problem, with :func:`held_out_metrics`, to ``self.evaluate_log``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from pydantic import Field

from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.heldout import Disjointness
from atroposlib.envs.reward_fns.graded import grade_answer

GRADES = ("strict", "lenient", "formatted")


class HeldOutEvalConfig(BaseEnvConfig):
    """An env config with the fields of a held-out evaluation (``--env.eval_size``)."""

    eval_size: int = Field(
        default=50, ge=1, description="Distinct held-out problems that evaluate() answers."
    )
    held_out_fraction: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Share of the problem space kept for evaluation only, chosen by a hash of "
        "the problem (atroposlib.envs.heldout), so training never draws it.",
    )


def graded_sample(
    problem: str, question: str, reply: str, is_right: Callable[[str], bool], **extra: Any
) -> dict[str, Any]:
    """One row of ``samples.jsonl`` as atropos-local compares them: ``problem`` (the key that
    matches a problem before and after), the question, the reply and its three grades.

    >>> graded_sample("3+4", "What is 3 + 4?", "<answer>7</answer>", lambda a: a == "7")
    {'problem': '3+4', 'question': 'What is 3 + 4?', 'response': '<answer>7</answer>', \
'formatted': True, 'strict': True, 'lenient': True}
    """
    graded = grade_answer(reply, is_right)
    return {"problem": problem, "question": question, "response": reply, **asdict(graded), **extra}


def held_out_metrics(
    samples: Sequence[dict[str, Any]], disjointness: Disjointness
) -> dict[str, float]:
    """``eval/strict``, ``eval/lenient``, ``eval/formatted`` and the disjointness check, which
    atropos-local reports beside the comparison (``overlap_with_training_pool``).

    >>> rows = [{"strict": True, "lenient": True, "formatted": True},
    ...         {"strict": False, "lenient": True, "formatted": False}]
    >>> held_out_metrics(rows, Disjointness(2, 90, 0, 0.1))  # doctest: +NORMALIZE_WHITESPACE
    {'eval/strict': 0.5, 'eval/lenient': 1.0, 'eval/formatted': 0.5,
     'eval/distinct_problems': 2.0, 'eval/training_pool_problems': 90.0,
     'eval/overlap_with_training_pool': 0.0}
    """
    if not samples:
        raise ValueError("no held-out samples to grade: eval_size problems were expected")
    metrics = {f"eval/{g}": sum(bool(s[g]) for s in samples) / len(samples) for g in GRADES}
    return {**metrics, **disjointness.as_metrics()}
