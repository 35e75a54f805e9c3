"""benchmarks/rollout_stats.py tells a collapse from learning: format from the reply's text,
right answers from what the reward holds beyond the format part."""

from __future__ import annotations

from benchmarks.rollout_stats import rows

SHAPED = "<think>1 + 2 = 3</think>\n<answer>3</answer>"
LOOSE = "The answer is 3."


def group(version: int, replies: list[str], scores: list[float], dropped: bool = False) -> dict:
    return {
        "policy_versions": [version] * len(replies),
        "messages": [[{"role": "assistant", "content": r}] for r in replies],
        "scores": scores,
        "finish_reasons": ["stop"] * (len(replies) - 1) + ["length"],
        "dropped": dropped,
    }


def test_format_and_right_answers_are_told_apart_per_version() -> None:
    groups = [
        # version 0: two shaped (one right: 1 + 0.5), one right without the format (1.0)
        group(0, [SHAPED, SHAPED, LOOSE, LOOSE], [1.5, 0.5, 1.0, 0.0]),
        # version 2: all shaped and wrong, the group dropped as all-equal
        group(2, [SHAPED] * 4, [0.5] * 4, dropped=True),
    ]
    header, first, second = rows(groups, format_weight=0.5, per=2)
    assert header.split() == ["versions", "groups", "dropped", "format", "right", "cut"]
    assert first.split() == ["0-1", "1", "0", "50%", "50.0%", "25%"]
    assert second.split() == ["2-3", "1", "1", "100%", "0.0%", "25%"]
