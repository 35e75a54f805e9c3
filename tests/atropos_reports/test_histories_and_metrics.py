"""Atropos reports about multi-turn histories, logged statistics and the trainer's per-sequence
means (register: docs/atropos-reports.md)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from atroposlib.utils.message_history_utils import ensure_trajectory_token_limit
from atroposlib.utils.metrics import get_std_min_max_avg
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from example_trainer.loss import BatchTotals, aggregate, gspo_ratio
from tests.fakes import ChatCharTokenizer

TOKENIZER = ChatCharTokenizer()  # one token per character


def turn(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def step(alternatives: list[list[dict[str, str]]]) -> dict[str, Any]:
    encoded = [tokenize_for_trainer(TOKENIZER, alternative) for alternative in alternatives]
    return {
        "seed": 7,
        "parsed_actions": [0] * len(alternatives),
        "scores": [0.0] * len(alternatives),
        "messages": alternatives,
        "tokens": [e["tokens"] for e in encoded],
        "masks": [e["masks"] for e in encoded],
    }


def length(messages: list[dict[str, str]]) -> int:
    return len(tokenize_for_trainer(TOKENIZER, messages)["tokens"])


SYSTEM = turn("system", "You play a game.")


def test_483_an_alternative_already_at_its_minimum_keeps_its_turns() -> None:
    long = [SYSTEM, turn("environment", "board 1"), turn("agent", "move " * 20),
            turn("environment", "board 2"), turn("agent", "move " * 20)]  # fmt: skip
    short = [SYSTEM, turn("environment", "board 1"), turn("assistant", "I resign.")]
    limit = max(length([SYSTEM, *long[3:]]), length(short))
    assert length(long) > limit

    [kept] = ensure_trajectory_token_limit([step([long, short])], TOKENIZER, limit)

    assert kept["messages"][1] == short
    assert kept["tokens"][1] == tokenize_for_trainer(TOKENIZER, short)["tokens"]
    assert kept["messages"][0] == [SYSTEM, *long[3:]]
    assert max(len(tokens) for tokens in kept["tokens"]) <= limit


def test_483_alternatives_of_three_depths_each_lose_only_what_they_can_spare() -> None:
    def game(moves: int, reply: str) -> list[dict[str, str]]:
        history = [SYSTEM]
        for move in range(moves):
            history += [turn("environment", f"board {move}"), turn("agent", reply)]
        return history

    deep, middle, shallow = game(3, "x" * 40), game(2, "y" * 30), game(1, "z" * 8)
    limit = max(length([SYSTEM, *deep[-2:]]), length(middle[:1] + middle[-2:]), length(shallow))

    [kept] = ensure_trajectory_token_limit([step([deep, middle, shallow])], TOKENIZER, limit)

    assert kept["messages"][2] == shallow
    assert [m["role"] for m in kept["messages"][1]] == ["system", "environment", "agent"]
    assert all(len(tokens) <= limit for tokens in kept["tokens"])


def test_351_statistics_skip_values_that_are_not_finite() -> None:
    stats = get_std_min_max_avg("train/score", [1.0, float("nan"), 3.0, float("inf")], {})
    assert stats == {"train/score_mean": 2.0, "train/score_std": 1.0,
                     "train/score_max": 3.0, "train/score_min": 1.0}  # fmt: skip


@pytest.mark.parametrize("window", [[], [float("nan")], [float("-inf"), float("inf")]])
def test_351_an_empty_window_logs_nan_instead_of_raising(window: list[float]) -> None:
    stats = get_std_min_max_avg("eval/len", window, {"kept": 1})
    assert stats["kept"] == 1 and len(stats) == 5
    assert all(math.isnan(stats[f"eval/len_{key}"]) for key in ("mean", "std", "max", "min"))


def test_230_a_sequence_with_no_trained_token_gives_a_finite_loss() -> None:
    loss = torch.tensor([[0.5, 0.5, 0.5], [0.2, 0.2, 0.2]])  # (B, T)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]])  # second row: prompt only
    totals = BatchTotals(tokens=2, sequences=1)
    for mode in ("token_mean", "seq_mean_token_mean", "constant"):
        value = aggregate(loss, mask, mode, totals, constant=3)
        assert torch.isfinite(value), mode
    assert torch.isfinite(gspo_ratio(loss, loss * 0.9, mask)).all()
