"""What ``collect_trajectories`` returns, and the checks a group passes before it is sent.

An env returns :class:`~atroposlib.group.ScoredData` (what :mod:`atroposlib.envs.rollouts`
builds) or, as Atropos envs do, a ``ScoredDataGroup`` dict; ``BaseEnv`` validates a dict into
``ScoredData`` once, then these checks run on the typed group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

from atroposlib.group import MASK_IGNORE_INDEX, ScoredData
from atroposlib.type_definitions import Message


class ScoredDataGroup(TypedDict):
    """G rollouts of the same item: Atropos's dict form of :class:`~atroposlib.group.ScoredData`."""

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: NotRequired[list[list[float]] | None]
    ref_logprobs: NotRequired[list[list[float]] | None]
    messages: NotRequired[list[list[Message]] | None]
    generation_params: NotRequired[dict[str, Any] | None]
    inference_logprobs: NotRequired[list[list[float]] | None]
    group_overrides: NotRequired[dict[str, Any] | None]
    overrides: NotRequired[list[dict[str, Any]] | None]
    images: NotRequired[Any | None]
    finish_reasons: NotRequired[list[str | None] | None]
    policy_versions: NotRequired[list[int | None] | None]
    token_policy_versions: NotRequired[list[list[int]] | None]
    extra: NotRequired[list[dict[str, Any]] | None]
    distill_token_ids: NotRequired[list[list[list[int]]] | None]
    """On-policy distillation: teacher top-k token ids, ``[sequence][position][k]``."""
    distill_logprobs: NotRequired[list[list[list[float]]] | None]
    """The teacher's logprobs of ``distill_token_ids``, same shape."""


class ScoredDataItem(TypedDict):
    """One rollout, returned by ``collect_trajectory``; G of them make a group."""

    tokens: list[int]
    masks: list[int]
    scores: float
    advantages: NotRequired[list[float] | None]
    ref_logprobs: NotRequired[list[float] | None]
    messages: NotRequired[list[Message] | None]
    inference_logprobs: NotRequired[list[float] | None]
    group_overrides: NotRequired[dict[str, Any] | None]
    overrides: NotRequired[dict[str, Any] | None]
    images: NotRequired[Any | None]
    finish_reason: NotRequired[str | None]
    token_policy_versions: NotRequired[list[int] | None]
    extra: NotRequired[dict[str, Any] | None]
    distill_token_ids: NotRequired[list[list[int]] | None]
    distill_logprobs: NotRequired[list[list[float]] | None]


_PER_SEQUENCE_FIELDS = (
    "advantages", "ref_logprobs", "messages", "inference_logprobs", "overrides",
    "token_policy_versions", "extra", "distill_token_ids", "distill_logprobs",
)  # fmt: skip


def group_from_items(items: Sequence[ScoredDataItem]) -> ScoredDataGroup:
    """Stack single rollouts into a group; optional fields are kept only when every item has one."""
    group: ScoredDataGroup = {
        "tokens": [item["tokens"] for item in items],
        "masks": [item["masks"] for item in items],
        "scores": [item["scores"] for item in items],
    }
    for field in _PER_SEQUENCE_FIELDS:
        values = [item.get(field) for item in items]
        if values and all(value is not None for value in values):
            group[field] = values  # type: ignore[literal-required]
    reasons = [item.get("finish_reason") for item in items]
    if any(reason is not None for reason in reasons):
        group["finish_reasons"] = reasons
    group_overrides: dict[str, Any] = {}
    for item in items:
        group_overrides.update(item.get("group_overrides") or {})
    if group_overrides:
        group["group_overrides"] = group_overrides
    images = [item["images"] for item in items if item.get("images") is not None]
    if images:
        group["images"] = images
    return group


def expected_group_size(group: ScoredData, default: int) -> int:
    """The size the env promises for this group: ``group_overrides.group_size`` or the config."""
    promised = group.group_overrides.group_size if group.group_overrides is not None else None
    return default if promised is None else promised


NO_SIGNAL = "no learning signal"


def is_no_signal(reason: str) -> bool:
    """Whether ``reason`` (of :func:`group_rejection_reason`) is only that the scores are all
    equal: a well-formed group that teaches nothing, worth keeping in a dump."""
    return reason.endswith(NO_SIGNAL)


OVER_BUDGET = "over max_token_len"


def is_over_budget(reason: str) -> bool:
    """Whether ``reason`` (of :func:`group_rejection_reason`) is a sequence longer than the
    trainer's token budget: a well-formed group the run could not use, kept in a dump so a
    run that sends nothing shows why."""
    return OVER_BUDGET in reason


def group_rejection_reason(
    group: ScoredData,
    *,
    group_size: int,
    max_token_len: int,
    ensure_scores_are_not_same: bool,
    require_trained_tokens: bool = True,
) -> str | None:
    """Why this group must not be sent, or ``None`` when it is fine.

    Shapes are checked when the group is built (``ScoredData``); these are the env's rules.
    ``require_trained_tokens=False`` (``process``, as Atropos wrote them) keeps groups whose
    every position is masked.
    ``max_token_len <= 0`` means the trainer accepts any length.

    >>> ok = ScoredData(tokens=[[1, 2], [1, 3]], masks=[[-100, 2], [-100, 3]], scores=[1, 0])
    >>> group_rejection_reason(ok, group_size=2, max_token_len=8, ensure_scores_are_not_same=True)
    >>> group_rejection_reason(ok, group_size=4, max_token_len=8, ensure_scores_are_not_same=True)
    'group has 2 sequences, expected group_size 4'
    """
    scores = group.scores
    expected = expected_group_size(group, group_size)
    if len(group.tokens) != expected:
        return f"group has {len(group.tokens)} sequences, expected group_size {expected}"
    if group.group_overrides is not None and group.group_overrides.screened:
        return f"stopped after {len(scores)} agreeing replies: {NO_SIGNAL}"
    if ensure_scores_are_not_same and len(scores) > 1 and len(set(scores)) == 1:
        return f"all {len(scores)} scores are equal ({scores[0]}): {NO_SIGNAL}"
    if max_token_len > 0:
        longest = max((len(seq) for seq in group.tokens), default=0)
        if longest > max_token_len:
            return f"a sequence has {longest} tokens, {OVER_BUDGET} {max_token_len}"
    if require_trained_tokens and all(
        all(m == MASK_IGNORE_INDEX for m in row) for row in group.masks
    ):
        return "every position is masked (-100): nothing to train on"
    return None
