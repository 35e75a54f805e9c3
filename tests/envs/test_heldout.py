"""The held-out split: deterministic, disjoint by construction, checked on the actual sets."""

from __future__ import annotations

import itertools
import random

import pytest

from atroposlib.envs.heldout import (
    HeldOutOverlapError,
    HeldOutSplit,
    HeldOutTooSmallError,
    canonical_problem,
    check_disjoint,
    held_out_problems,
    training_problems,
)
from atroposlib.errors import ConfigError


def sums(seed: int, top: int = 100) -> itertools.islice[str]:
    rng = random.Random(seed)
    draws = (f"{rng.randint(0, top)} + {rng.randint(0, top)}" for _ in itertools.count())
    return itertools.islice(draws, 200_000)


def key(expression: str) -> str:
    return canonical_problem(f"Calculate {expression}.", {"expression": expression})


def test_the_split_is_a_fixed_fraction_of_keys_on_every_run() -> None:
    split = HeldOutSplit(0.1)
    keys = [f"problem {n}" for n in range(20_000)]
    held = [k for k in keys if split.is_held_out(k)]
    assert 0.09 < len(held) / len(keys) < 0.11
    assert held == [k for k in keys if HeldOutSplit(0.1).is_held_out(k)]  # no hash() salting
    other = [k for k in keys if HeldOutSplit(0.1, salt="other").is_held_out(k)]
    assert other != held  # the salt names the split
    assert not any(HeldOutSplit(0.0).is_held_out(k) for k in keys[:1000])
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        HeldOutSplit(1.0)


def test_training_and_held_out_never_meet_whatever_they_draw() -> None:
    split = HeldOutSplit(0.1)
    train = training_problems(sums(seed=1), key, split, 5_000)
    held_out = held_out_problems(sums(seed=2), key, split, 200)
    assert len(train) == 5_000 and len(held_out) == 200
    assert len({key(p) for p in held_out}) == 200  # distinct
    assert not {key(p) for p in train} & {key(p) for p in held_out}
    # 83 + 50 and 50 + 83 are one problem: they land on the same side
    assert split.is_held_out(key("83 + 50")) == split.is_held_out(key("50 + 83"))
    report = check_disjoint([key(p) for p in held_out], map(key, train), 0.1)
    assert (report.eval_problems, report.overlap) == (200, 0)
    assert report.training_pool == len({key(p) for p in train})
    assert report.as_metrics()["eval/overlap_with_training_pool"] == 0.0


def test_a_small_problem_space_is_refused_not_reused() -> None:
    with pytest.raises(HeldOutTooSmallError, match=r"only \d+ distinct held-out problems"):
        held_out_problems(sums(seed=3, top=10), key, HeldOutSplit(0.1), 200)


def test_an_eval_set_that_meets_the_training_pool_is_refused() -> None:
    split = HeldOutSplit(0.0)  # no split: eval and training draw from the same small space
    train = training_problems(sums(seed=1, top=10), key, split, 1_000)
    held_out = held_out_problems(sums(seed=2, top=10), key, split, 50)
    with pytest.raises(HeldOutOverlapError, match="of 50 evaluation problems are in the training"):
        check_disjoint([key(p) for p in held_out], map(key, train), 0.0)


def test_excluded_problems_are_never_chosen_for_evaluation() -> None:
    split = HeldOutSplit(0.1)
    plain = held_out_problems(sums(seed=2, top=100), key, split, 50)
    shown = {key(plain[0]), key(plain[7])}  # e.g. the prompt's worked examples
    chosen = held_out_problems(sums(seed=2, top=100), key, split, 50, exclude=shown)
    assert len({key(p) for p in chosen}) == 50
    assert not shown & {key(p) for p in chosen}
