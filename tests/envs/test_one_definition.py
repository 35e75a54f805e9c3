"""One answer extractor and one advantage formula: the cases where the old copies disagreed."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from atroposlib.envs.reward_fns.accuracy_reward import verify_answer
from atroposlib.envs.reward_fns.answers import extract_boxed, final_answer
from atroposlib.utils.advantages import group_relative_advantages, grouped_advantages
from example_trainer.loss import group_advantages


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (r"so \boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # a flat regex stopped at the first }
        (r"\boxed{3} at first, then \boxed{4}", "4"),  # the final box is the answer
        (r"\boxed{x^{2}+1}", "x^{2}+1"),
        ("work #### 1,234", "1,234"),
        ("no answer", "no answer"),
    ],
)
def test_final_answer_reads_nested_and_last_boxes(reply: str, expected: str) -> None:
    assert final_answer(reply) == expected


def test_the_accuracy_reward_and_the_math_envs_read_the_same_box() -> None:
    reply = r"first \boxed{2}, corrected: \boxed{\frac{1}{2}}"
    assert extract_boxed(reply) == final_answer(reply) == r"\frac{1}{2}"
    assert verify_answer(r"\boxed{\frac{1}{2}}", "0.5")
    assert verify_answer(r"\boxed{\frac{1}{2}}", r"\boxed{\frac{1}{2}}")
    assert not verify_answer(r"so \boxed{2}", r"\boxed{\frac{1}{2}}")
    assert verify_answer(r"\boxed{1,200}", 1200)


def test_env_and_trainer_advantages_are_the_same_numbers() -> None:
    rng = random.Random(22)
    for _ in range(200):
        scores = [rng.choice([0.0, 1.0, rng.uniform(-2, 2)]) for _ in range(rng.randint(1, 9))]
        env_side = group_relative_advantages(scores)
        (trainer_side,) = group_advantages(
            [torch.tensor(scores, dtype=torch.float64)], "group_mean", "group", eps=1e-4
        )
        assert env_side == pytest.approx(trainer_side.tolist(), abs=1e-12)


def test_advantages_use_the_unbiased_std_plus_eps() -> None:
    scores = [1.0, 0.0, 1.0, 0.0]  # the two copies answered +-1.0 and +-0.866 here
    std = statistics.stdev(scores)
    assert group_relative_advantages(scores) == pytest.approx(
        [0.5 / (std + 1e-4), -0.5 / (std + 1e-4)] * 2
    )
    tiny = [0.0, 1e-7]  # std below eps: divided by std + eps, not zeroed
    expected = 0.5e-7 / (statistics.stdev(tiny) + 1e-4)
    assert group_relative_advantages(tiny) == pytest.approx([-expected, expected])
    assert grouped_advantages([[5.0]]) == [[0.0]]
    assert not math.isnan(grouped_advantages([[1.0, 1.0]], std="batch")[0][0])
