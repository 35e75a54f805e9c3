"""What a local run leaves behind: reward per step (format vs. correctness), eval flips, a PNG.

Rewards per step come from the environment's rollout dump (``rollouts.jsonl``): the groups
carry ``policy_version`` (the trainer step of the weights that sampled them) and their chat
messages, so the format component is recomputed from the text and the rest of the score is
correctness. The held-out comparison joins the greedy ``samples.jsonl`` written by
``env.py evaluate`` before and after training, problem by problem, graded strict (the
``<answer>`` format and right), lenient (right at all) and for format; it carries the
environment's start-up disjointness check and a second, independent one against the prompts
actually trained on (``rollouts.jsonl``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from atroposlib.envs.reward_fns.format_rewards import (
    answer_tag_format_credit,
    answer_tag_format_reward,
)
from atroposlib.localrun.bootstrap import Interval, bootstrap_mean, gains


@dataclass(frozen=True)
class StepRewards:
    step: int
    sequences: int
    reward: float
    format_rate: float
    correct: float


@dataclass(frozen=True)
class Accuracy:
    before: float
    after: float
    right_to_wrong: int
    wrong_to_right: int
    gain_low: float
    """Lower end of the 95 % bootstrap interval (over problems) of ``after - before``."""
    gain_high: float


@dataclass(frozen=True)
class EvalComparison:
    problems: int
    """Distinct problems answered both before and after."""
    strict: Accuracy
    lenient: Accuracy
    format_before: float
    format_after: float
    overlap_with_training_pool: int | None
    """Held-out problems in the env's training pool (its start-up check; None: not reported)."""
    training_pool_problems: int | None
    overlap_with_trained_prompts: int
    """Held-out questions found among the prompts of ``rollouts.jsonl``."""


def rewards_by_step(
    rollouts: Path, format_weight: float, partial_format: bool = False
) -> list[StepRewards]:
    """Mean score, format compliance and correctness of sampled completions, per policy step.

    Correctness is the score less the format credit the env gave (``format_weight`` times its
    format reward: partial credit when ``partial_format``, as the env's setting of that name).
    """
    credit_of = answer_tag_format_credit(partial_format)
    scores: dict[int, list[float]] = defaultdict(list)
    formats: dict[int, list[float]] = defaultdict(list)
    credits: dict[int, list[float]] = defaultdict(list)
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
                credits[step].append(credit_of([reply])[0])
    rows = []
    for step in sorted(scores):
        mean_score = _mean(scores[step])
        rows.append(
            StepRewards(step, len(scores[step]), mean_score, _mean(formats[step]),
                        mean_score - format_weight * _mean(credits[step]))
        )  # fmt: skip
    return rows


def compare_evals(before: Path, after: Path, rollouts: Path | None = None) -> EvalComparison | None:
    """Strict/lenient accuracy and format before/after, with flips, on the same problems."""
    first, second = _load_samples(before), _load_samples(after)
    common = sorted(set(first) & set(second))
    if not common:
        return None
    check = _env_metrics(before)
    pool_overlap = check.get("eval/overlap_with_training_pool")
    pool_size = check.get("eval/training_pool_problems")
    questions = {str(first[k].get("question", "")) for k in common}
    return EvalComparison(
        problems=len(common),
        strict=_accuracy([(_graded(first[k], "strict"), _graded(second[k], "strict"))
                          for k in common]),
        lenient=_accuracy([(_graded(first[k], "lenient"), _graded(second[k], "lenient"))
                           for k in common]),
        format_before=_mean([float(_graded(first[k], "formatted")) for k in common]),
        format_after=_mean([float(_graded(second[k], "formatted")) for k in common]),
        overlap_with_training_pool=None if pool_overlap is None else int(pool_overlap),
        training_pool_problems=None if pool_size is None else int(pool_size),
        overlap_with_trained_prompts=len(trained_questions(rollouts, questions)) if rollouts else 0,
    )  # fmt: skip


def trained_questions(rollouts: Path, questions: set[str]) -> set[str]:
    """The ``questions`` that some group in ``rollouts`` was prompted with.

    A question counts when a trained user message is that question, or starts with it and goes
    on after whitespace (an appended instruction).
    """
    if not rollouts.exists():
        return set()
    prompts: set[str] = set()
    with rollouts.open() as handle:
        for line in handle:
            chats = json.loads(line).get("messages") or [[]]
            prompts.update(str(m.get("content") or "") for m in chats[0] if m.get("role") == "user")
    return {
        question
        for question in questions
        for prompt in prompts
        if prompt == question or (prompt.startswith(question) and prompt[len(question)].isspace())
    }


def disk_usage(folder: Path) -> int:
    """Bytes on disk under ``folder``, as ``du`` counts them (a hard-linked file once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path in [folder, *folder.rglob("*")]:
        try:
            stat = path.lstat()
        except FileNotFoundError:
            continue
        if (stat.st_dev, stat.st_ino) not in seen:
            seen.add((stat.st_dev, stat.st_ino))
            total += stat.st_blocks * 512
    return total


def _graded(sample: dict[str, Any], grade: str) -> bool:
    """A sample's ``strict``/``lenient``/``formatted`` grade; envs that write only ``score``
    count a score of 1 as right under both, and the format is read from the response."""
    if grade in sample:
        return bool(sample[grade])
    if grade == "formatted":
        return answer_tag_format_reward([str(sample.get("response", ""))])[0] > 0
    return float(sample.get("score", 0.0)) >= 1.0


def _accuracy(pairs: list[tuple[bool, bool]]) -> Accuracy:
    gain = bootstrap_mean(gains([a for a, _ in pairs], [b for _, b in pairs]))
    return Accuracy(
        before=_mean([float(a) for a, _ in pairs]),
        after=_mean([float(b) for _, b in pairs]),
        right_to_wrong=sum(a and not b for a, b in pairs),
        wrong_to_right=sum(b and not a for a, b in pairs),
        gain_low=gain.low,
        gain_high=gain.high,
    )


def _env_metrics(folder: Path) -> dict[str, float]:
    """The metrics the environment wrote next to its samples (``metrics.json``)."""
    try:
        results = json.loads((folder / "metrics.json").read_text())["results"]["all"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return results if isinstance(results, dict) else {}


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


def plot_rewards(rows: list[StepRewards], path: Path) -> str | None:
    """Draw the reward curve at ``path``; None, or why it was not drawn (matplotlib comes with
    the trainer extra: an install without it still gets summary.json)."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install 'atroposlib[trainer]')"

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
    return None


GRADING = (
    "greedy replies; strict: the reply is exactly <answer>...</answer> (after an optional "
    "<think> block) and its content is right; lenient: the <answer> content, or without a "
    "non-empty tag the reply's last number, is right; format: the strict shape, right or not"
)


def write_summary(
    path: Path, rows: list[StepRewards], comparison: EvalComparison | None, **extra: Any
) -> dict[str, Any]:
    gain = first_last_gain(rows)
    held_out = {**asdict(comparison), "grading": GRADING} if comparison else None
    summary: dict[str, Any] = {
        **extra,
        "steps_with_rollouts": len(rows),
        "reward_first5": gain[0] if gain else None,
        "reward_last5": gain[1] if gain else None,
        "rewards_by_step": [asdict(r) for r in rows],
        "held_out_eval": held_out,
    }
    path.write_text(json.dumps(summary, indent=2))
    return summary


def headline(summary: dict[str, Any]) -> list[str]:
    """The summary as a few lines for people: held-out before -> after, reward, disk, time."""
    lines = []
    held_out = summary.get("held_out_eval")
    if held_out:
        pool = held_out["training_pool_problems"]
        overlap = held_out["overlap_with_training_pool"]
        checked = (
            "not checked by the env"
            if overlap is None
            else f"{overlap} in the training pool of {pool:,}"
        )
        lines.append(
            f"held-out: {held_out['problems']} distinct problems ({checked}; "
            f"{held_out['overlap_with_trained_prompts']} among the trained prompts)"
        )
        for name, label in (("strict", "strict (format + right)"), ("lenient", "lenient")):
            grade = held_out[name]
            interval = Interval(
                grade["after"] - grade["before"], grade["gain_low"], grade["gain_high"], 0.95
            )
            lines.append(
                f"  {label:<24} {_percent(grade['before'])} -> {_percent(grade['after'])}"
                f"   right->wrong {grade['right_to_wrong']}, wrong->right {grade['wrong_to_right']}"
                f"   gain {interval}"
            )
        lines.append(
            f"  {'format compliance':<24} {_percent(held_out['format_before'])} -> "
            f"{_percent(held_out['format_after'])}"
        )
    lines += snapshot_lines(summary)
    if summary.get("reward_first5") is not None:
        lines.append(
            f"sampled training reward: first-5 steps {summary['reward_first5']:.3f} -> "
            f"last-5 {summary['reward_last5']:.3f} (not evidence of learning: see held-out)"
        )
    precision = f" ({summary['precision']})" if summary.get("precision") else ""
    lines.append(
        f"wall time {summary.get('wall_s', 0) / 60:.1f} min{precision}, "
        f"disk {summary.get('disk_bytes', 0) / 1e9:.2f} GB"
    )
    return lines


def snapshot_lines(summary: dict[str, Any]) -> list[str]:
    """Held-out strict accuracy at each snapshot, the best one, and every warning raised."""
    lines = []
    snapshots = summary.get("held_out_snapshots") or []
    if len(snapshots) > 2:  # more than before and after
        steps = ", ".join(f"step {s['step']} {100 * s['strict']:.1f} %" for s in snapshots)
        lines.append(f"held-out strict by step: {steps}")
    best = summary.get("best_held_out")
    if best and len(snapshots) > 1:
        lines.append(
            f"best held-out strict {100 * best['strict']:.1f} % at step {best['step']}: "
            f"{best['weights']}"
        )
    lines += [
        f"WARNING (step {w['step']}): {w['warning']}" for w in summary.get("warnings_raised") or []
    ]
    return lines


def _percent(value: float) -> str:
    return f"{100 * value:5.1f} %"


def _load_samples(folder: Path) -> dict[str, dict[str, Any]]:
    path = folder / "samples.jsonl"
    if not path.exists():
        return {}
    samples = {}
    with path.open() as handle:
        for line in handle:
            sample = json.loads(line)
            key = (
                sample.get("problem") or f"{sample.get('task', '')}\x00{sample.get('question', '')}"
            )
            samples[str(key)] = sample
    return samples


def _last_assistant_text(chat: list[dict[str, Any]]) -> str:
    for message in reversed(chat):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return ""


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
