"""What a local run leaves behind: reward per step (format vs. correctness), eval flips, a PNG.

Rewards per step come from the environment's rollout dump (``rollouts.jsonl``): the groups
carry ``policy_version`` (the trainer step of the weights that sampled them) and their chat
messages, so the format component is recomputed from the text and the rest of the score is
correctness. The held-out comparison joins the greedy ``samples.jsonl`` written by
``env.py evaluate`` before and after training, problem by problem.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from atroposlib.envs.reward_fns.format_rewards import answer_tag_format_reward


@dataclass(frozen=True)
class StepRewards:
    step: int
    sequences: int
    reward: float
    format_rate: float
    correct: float


@dataclass(frozen=True)
class EvalComparison:
    problems: int
    accuracy_before: float
    accuracy_after: float
    format_before: float
    format_after: float
    right_to_wrong: int
    wrong_to_right: int


def rewards_by_step(rollouts: Path, format_weight: float) -> list[StepRewards]:
    """Mean score, format compliance and correctness of sampled completions, per policy step."""
    scores: dict[int, list[float]] = defaultdict(list)
    formats: dict[int, list[float]] = defaultdict(list)
    if not rollouts.exists():
        return []
    with rollouts.open() as handle:
        for line in handle:
            group = json.loads(line)
            step = int(group.get("policy_version") or 0)
            messages = group.get("messages") or [[] for _ in group["scores"]]
            for score, chat in zip(group["scores"], messages, strict=False):
                reply = _last_assistant_text(chat)
                scores[step].append(float(score))
                formats[step].append(1.0 if answer_tag_format_reward([reply])[0] > 0 else 0.0)
    rows = []
    for step in sorted(scores):
        mean_score = _mean(scores[step])
        format_rate = _mean(formats[step])
        rows.append(
            StepRewards(step, len(scores[step]), mean_score, format_rate,
                        mean_score - format_weight * format_rate)
        )  # fmt: skip
    return rows


def compare_evals(before: Path, after: Path) -> EvalComparison | None:
    """Greedy accuracy and format compliance before/after, with flips, on the same problems."""
    first, second = _load_samples(before), _load_samples(after)
    common = sorted(set(first) & set(second))
    if not common:
        return None

    def right(sample: dict[str, Any]) -> bool:
        return float(sample.get("score", 0.0)) >= 1.0

    def formatted(sample: dict[str, Any]) -> float:
        return 1.0 if answer_tag_format_reward([str(sample.get("response", ""))])[0] > 0 else 0.0

    return EvalComparison(
        problems=len(common),
        accuracy_before=_mean([float(right(first[k])) for k in common]),
        accuracy_after=_mean([float(right(second[k])) for k in common]),
        format_before=_mean([formatted(first[k]) for k in common]),
        format_after=_mean([formatted(second[k]) for k in common]),
        right_to_wrong=sum(right(first[k]) and not right(second[k]) for k in common),
        wrong_to_right=sum(not right(first[k]) and right(second[k]) for k in common),
    )


def first_last_gain(rows: list[StepRewards], window: int = 5) -> tuple[float, float] | None:
    if len(rows) < 2 * window:
        return None
    return _mean([r.reward for r in rows[:window]]), _mean([r.reward for r in rows[-window:]])


def rolling_mean(values: list[float], window: int) -> list[float]:
    """Mean of the last ``window`` values at each point (fewer at the start).

    >>> rolling_mean([1.0, 3.0, 5.0, 7.0], 2)
    [1.0, 2.0, 4.0, 6.0]
    """
    return [_mean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def plot_rewards(rows: list[StepRewards], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    steps = [r.step for r in rows]
    rewards = [r.reward for r in rows]
    axis.plot(steps, rewards, marker="o", alpha=0.35, label="mean reward per step")
    axis.plot(steps, rolling_mean(rewards, 5), linewidth=2.5, label="5-step rolling mean")
    axis.plot(steps, [r.format_rate for r in rows], linestyle="--", label="format compliance")
    axis.plot(steps, [r.correct for r in rows], linestyle=":", label="correctness")
    axis.set_xlabel("policy step (weights that sampled the rollouts)")
    axis.set_ylabel("per sequence")
    axis.set_title("atropos-local: sampled training reward")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_summary(
    path: Path, rows: list[StepRewards], comparison: EvalComparison | None, **extra: Any
) -> dict[str, Any]:
    gain = first_last_gain(rows)
    summary: dict[str, Any] = {
        **extra,
        "steps_with_rollouts": len(rows),
        "reward_first5": gain[0] if gain else None,
        "reward_last5": gain[1] if gain else None,
        "rewards_by_step": [asdict(r) for r in rows],
        "held_out_eval": asdict(comparison) if comparison else None,
    }
    path.write_text(json.dumps(summary, indent=2))
    return summary


def _load_samples(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / "samples.jsonl"
    if not path.exists():
        return {}
    samples = {}
    with path.open() as handle:
        for line in handle:
            sample = json.loads(line)
            samples[f"{sample.get('task', '')}\x00{sample.get('question', '')}"] = sample
    return samples


def _last_assistant_text(chat: list[dict[str, Any]]) -> str:
    for message in reversed(chat):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
