"""What a run's sampled replies did, by policy version: format, right answers, dropped groups.

    python benchmarks/rollout_stats.py runs/local-.../rollouts.jsonl --format-weight 0.1

Reads the groups ``atropos-local`` writes (``rollouts.jsonl`` with messages, the dropped ones
included) and prints one row per ``--per`` policy versions: groups, of them dropped as
all-equal, the share of replies with the exact format, the share with a right answer, and the
share cut at the token limit. It tells a collapse (format up, right answers down) from a slow
start; the issue-35 diagnosis (docs/learning-vs-trl/collapse-diagnosis.md) was read from it.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from atroposlib.envs.reward_fns.format_rewards import answer_tag_format_reward


def first_version(group: dict[str, Any]) -> int:
    versions = group.get("policy_versions")
    if isinstance(versions, list) and versions:
        return int(min(versions))
    return int(versions) if versions is not None else -1


def rows(groups: list[dict[str, Any]], format_weight: float, per: int) -> list[str]:
    """Format from the reply's text (the env's exact-shape check); right: what the reward has
    beyond the format part is 1 (the task's own score of the answer)."""
    buckets: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for group in groups:
        buckets[first_version(group) // per * per].append(group)
    lines = ["versions  groups  dropped  format  right  cut"]
    for start in sorted(buckets):
        bucket = buckets[start]
        scores = [s for g in bucket for s in g["scores"]]
        replies = [m[-1]["content"] for g in bucket for m in g["messages"]]
        shaped = answer_tag_format_reward(replies)
        finishes = [f for g in bucket for f in g.get("finish_reasons") or []]
        formatted = sum(shaped)
        right = sum(
            s - format_weight * f >= 1.0 - 1e-9 for s, f in zip(scores, shaped, strict=True)
        )
        dropped = sum(bool(g.get("dropped")) for g in bucket)
        cut = sum(f == "length" for f in finishes) / max(len(finishes), 1)
        lines.append(
            f"{start:>3}-{start + per - 1:<4} {len(bucket):>6} {dropped:>8} "
            f"{100 * formatted / len(scores):>5.0f}% {100 * right / len(scores):>5.1f}% "
            f"{100 * cut:>3.0f}%"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rollouts", type=Path, help="rollouts.jsonl of a run")
    parser.add_argument("--format-weight", type=float, required=True, help="The env's.")
    parser.add_argument("--per", type=int, default=2, help="Policy versions per row.")
    args = parser.parse_args()
    lines = args.rollouts.read_text().splitlines()
    groups = [json.loads(line) for line in lines if line.strip()]
    print("\n".join(rows(groups, args.format_weight, args.per)))


if __name__ == "__main__":
    main()
