"""From a broker batch to padded tensors: samples, advantages, micro-batches.

A batch is a list of groups as the broker hands them out (COMPAT): per-token fields
(``tokens``, ``masks``, ``advantages``, ``ref_logprobs``, ``inference_logprobs``) are lists of
1-D arrays or lists; the rest (scores, declared overrides, finish reasons, ...) is read through
:class:`atroposlib.group.GroupMeta`, the typed group without its arrays. Everything here is
deterministic, so every rank turns the same batch into the same samples and micro-batch plan.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import torch
from pydantic import ValidationError
from torch import Tensor

from atroposlib.group import MASK_IGNORE_INDEX, GroupMeta
from example_trainer.config import LossConfig
from example_trainer.loss import BatchTotals, group_advantages, role_advantages

T = TypeVar("T")
logger = logging.getLogger(__name__)


@dataclass
class Sample:
    """One trained sequence; arrays are aligned with ``tokens`` (L,)."""

    tokens: np.ndarray  # (L,) int64
    labels: np.ndarray  # (L,) int64, -100 where not trained
    advantages: np.ndarray  # (L,) float32
    inference_logprobs: np.ndarray | None  # (L,) float32
    ref_logprobs: np.ndarray | None  # (L,) float32
    temperature: float = 1.0
    sft: bool = False
    weight: float = 1.0  # 0.0 leaves the sequence out of the loss
    score: float = 0.0
    env_id: int | None = None
    policy_version: int | None = None  # the weight version of its oldest sampled token
    zero_advantage: bool = False  # override set_advantage_to_zero
    token_versions: np.ndarray | None = None  # (L,) int64, -1 where not sampled
    distill_ids: np.ndarray | None = None  # (L, K) int64 teacher top-k ids, -1 where none
    distill_logprobs: np.ndarray | None = None  # (L, K) float32

    @property
    def trained_tokens(self) -> int:
        return int((self.labels[1:] != MASK_IGNORE_INDEX).sum()) if self.weight > 0 else 0


@dataclass
class BatchStats:
    rewards_by_env: dict[str, float] = field(default_factory=dict)
    advantage: dict[str, float] = field(default_factory=dict)
    zero_variance_groups: int = 0
    truncated_masked: int = 0
    sft_rows: int = 0
    invalid_groups: int = 0
    policy_versions: list[int] = field(default_factory=list)


def _array(x: Any, dtype: type) -> np.ndarray:
    return np.asarray(x, dtype=dtype).reshape(-1)


def _meta(group: Mapping[str, Any]) -> GroupMeta | None:
    """The group's typed metadata; None (logged) when a broker let an invalid group through."""
    try:
        meta = GroupMeta.model_validate(group)
    except ValidationError as exc:
        logger.error("group skipped, its metadata is invalid: %s", exc.errors()[0])
        return None
    if meta.size != len(group["tokens"]):
        logger.error("group skipped: %d scores for %d sequences", meta.size, len(group["tokens"]))
        return None
    return meta


def _distill_rows(group: Mapping[str, Any], i: int, length: int) -> dict[str, Any]:
    """Sequence i's teacher top-k as (L, K) arrays (ids -1 where a position has fewer)."""
    ids, logprobs = group.get("distill_token_ids"), group.get("distill_logprobs")
    if ids is None or logprobs is None or ids[i] is None or logprobs[i] is None:
        return {}
    k = max((len(row) for row in ids[i]), default=0)
    out_ids = np.full((length, max(k, 1)), -1, np.int64)
    out_lp = np.zeros((length, max(k, 1)), np.float32)
    for position, (row_ids, row_lp) in enumerate(zip(ids[i], logprobs[i], strict=True)):
        out_ids[position, : len(row_ids)] = row_ids
        out_lp[position, : len(row_lp)] = row_lp
    return {"distill_ids": out_ids, "distill_logprobs": out_lp}


def batch_to_samples(
    groups: Sequence[Mapping[str, Any]],
    cfg: LossConfig,
    role_baselines: Mapping[Hashable, float] | None = None,
) -> tuple[list[Sample], dict[Hashable, float], BatchStats]:
    """Turn groups into samples with per-token advantages; returns new SPIRAL baselines."""
    baselines: dict[Hashable, float] = dict(role_baselines or {})
    stats = BatchStats()
    samples: list[Sample] = []
    score_groups: list[tuple[list[int], Tensor]] = []  # (sample indices, scores) for baselines
    role_rows: list[tuple[int, Hashable]] = []
    rewards: dict[str, list[float]] = defaultdict(list)

    for group in groups:
        meta = _meta(group)
        if meta is None:
            stats.invalid_groups += 1
            continue
        given_adv = group.get("advantages")
        start = len(samples)
        rl_rows: list[int] = []
        for i in range(meta.size):
            sample = _sample(group, meta, i, cfg, stats)
            samples.append(sample)
            rewards[str(meta.env_id)].append(meta.scores[i])
            role = meta.override(i, "role")
            if sample.sft or given_adv is not None:
                continue
            if cfg.role_baseline and role is not None:
                role_rows.append((start + i, (meta.env_id, role)))
            else:
                rl_rows.append(start + i)
        if rl_rows:
            group_scores = torch.tensor([samples[j].score for j in rl_rows], dtype=torch.float64)
            score_groups.append((rl_rows, group_scores))

    _apply_group_baselines(samples, score_groups, cfg, stats)
    if role_rows:  # SPIRAL role-conditioned baselines, in batch order
        role_adv, baselines = role_advantages(
            [samples[j].score for j, _ in role_rows],
            [key for _, key in role_rows],
            baselines,
            cfg.role_baseline_decay,
        )
        for (j, _), a in zip(role_rows, role_adv, strict=True):
            samples[j].advantages[:] = a
    for sample in samples:
        if sample.zero_advantage:
            sample.advantages[:] = 0.0
    _summarize(samples, rewards, stats)
    return samples, baselines, stats


def _sample(
    group: Mapping[str, Any], meta: GroupMeta, i: int, cfg: LossConfig, stats: BatchStats
) -> Sample:
    """Sequence ``i`` of a group, its advantages zero unless the env gave them."""
    tokens = _array(group["tokens"][i], np.int64)
    sft = bool(meta.override(i, "sft", False))
    weight = 0.0 if (meta.truncated(i) and cfg.mask_truncated and not sft) else 1.0
    stats.truncated_masked += int(weight == 0.0)
    stats.sft_rows += int(sft)
    given_adv = group.get("advantages")
    gen_temp = float((meta.generation_params or {}).get("temperature", 1.0))

    def row(name: str, dtype: Any) -> np.ndarray | None:
        rows = group.get(name)
        return None if rows is None or rows[i] is None else _array(rows[i], dtype)

    return Sample(
        **_distill_rows(group, i, len(tokens)),
        tokens=tokens,
        labels=_array(group["masks"][i], np.int64),
        advantages=(
            _array(given_adv[i], np.float32)
            if given_adv is not None and given_adv[i] is not None
            else np.zeros_like(tokens, dtype=np.float32)
        ),
        inference_logprobs=row("inference_logprobs", np.float32),
        ref_logprobs=row("ref_logprobs", np.float32),
        temperature=float(meta.override(i, "temperature", gen_temp)),
        sft=sft,
        weight=weight,
        score=meta.scores[i],
        env_id=meta.env_id,
        policy_version=_oldest_version(meta, i),
        zero_advantage=bool(meta.override(i, "set_advantage_to_zero", False)),
        token_versions=row("token_policy_versions", np.int64),
    )


def _apply_group_baselines(
    samples: list[Sample],
    score_groups: list[tuple[list[int], Tensor]],
    cfg: LossConfig,
    stats: BatchStats,
) -> None:
    """Group baselines (mean / leave-one-out, std none / group / batch) into the samples."""
    advs = group_advantages(
        [s for _, s in score_groups], cfg.advantage_baseline, cfg.advantage_std, cfg.std_eps
    )
    for (rows, scores_t), adv_t in zip(score_groups, advs, strict=True):
        zero_var = bool((scores_t == scores_t[0]).all())
        stats.zero_variance_groups += int(zero_var)
        for j, a in zip(rows, adv_t.tolist(), strict=True):
            samples[j].advantages[:] = a
            if zero_var and cfg.mask_zero_variance_groups:
                samples[j].weight = 0.0


def _summarize(samples: list[Sample], rewards: dict[str, list[float]], stats: BatchStats) -> None:
    stats.rewards_by_env = {k: float(np.mean(v)) for k, v in rewards.items()}
    trained = [
        float(s.advantages[s.labels != MASK_IGNORE_INDEX].mean())
        for s in samples
        if s.weight > 0 and not s.sft and s.trained_tokens > 0
    ]
    if trained:
        a = np.asarray(trained)
        stats.advantage = {"mean": a.mean(), "std": a.std(), "min": a.min(), "max": a.max()}
    stats.policy_versions = [s.policy_version for s in samples if s.policy_version is not None]


def _oldest_version(meta: GroupMeta, index: int) -> int | None:
    """The sequence's oldest token's version (``policy_versions``), else the group's."""
    own = meta.policy_versions[index] if meta.policy_versions is not None else None
    return own if own is not None else meta.policy_version


def version_lags(samples: Sequence[Sample], step: int) -> np.ndarray:
    """How many updates old each trained token's weights were when step ``step`` trains on it:
    ``(step - 1) - version`` (the weights after step ``step - 1`` are version ``step - 1``).
    Tokens without a version (per token, else the sequence's) are left out."""
    lags = []
    for sample in samples:
        if sample.weight == 0:
            continue
        trained = sample.labels != MASK_IGNORE_INDEX
        if sample.token_versions is not None:
            versions = sample.token_versions[trained]
            versions = versions[versions >= 0]
        elif sample.policy_version is not None:
            versions = np.full(int(trained.sum()), sample.policy_version)
        else:
            continue
        lags.append((step - 1) - versions)
    return np.concatenate(lags) if lags else np.zeros(0, dtype=np.int64)


def batch_totals(samples: Sequence[Sample]) -> BatchTotals:
    counts = [s.trained_tokens for s in samples]
    return BatchTotals(tokens=sum(counts), sequences=sum(c > 0 for c in counts))


# ---------------------------------------------------------------------------------------
# Micro-batches
# ---------------------------------------------------------------------------------------


def plan_microbatches(
    lengths: Sequence[int], token_budget: int, bucket: bool = True
) -> list[list[int]]:
    """Indices per micro-batch so that rows x longest row <= token_budget.

    bucket=True sorts by length (longest first) and fills greedily, so rows of similar length
    share a micro-batch; bucket=False keeps arrival order and pads every row to the longest
    sequence of the batch (the naive baseline).
    """
    if not lengths:
        return []
    if not bucket:
        per = max(1, token_budget // max(lengths))
        return [list(range(i, min(i + per, len(lengths)))) for i in range(0, len(lengths), per)]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]
        if current and (len(current) + 1) * longest > token_budget:
            plan.append(current)
            current = []
        current.append(i)
    plan.append(current)
    return plan


def micro_batch_costs(plan: Sequence[Sequence[int]], lengths: Sequence[int]) -> list[int]:
    """Tokens each padded micro-batch processes: rows x longest row."""
    return [len(mb) * max(lengths[i] for i in mb) for mb in plan]


def padded_tokens(plan: Sequence[Sequence[int]], lengths: Sequence[int]) -> int:
    return sum(micro_batch_costs(plan, lengths))


def shard_plan(plan: Sequence[T], costs: Sequence[int], world_size: int, rank: int) -> list[T]:
    """Deal micro-batches to ranks, largest cost (processed tokens) first to the least loaded."""
    loads = [0] * world_size
    mine: list[T] = []
    for k in sorted(range(len(plan)), key=lambda k: (-costs[k], k)):
        target = min(range(world_size), key=lambda r: (loads[r], r))
        loads[target] += costs[k]
        if target == rank:
            mine.append(plan[k])
    return mine


@dataclass
class PackedRows:
    """A micro-batch's sequences in R rows of W tokens (sequence_packing.py, prefix_sharing.py).

    Entry e predicts ``targets[e]`` at ``temperature[e]`` from the logits of the
    ``kept[e]``-th scored position (row-major; without ``kept``, entry k is the k-th scored
    position, E = K). ``index`` maps the padded next-token layout (B, T-1) of MicroBatch to
    those e, and positions that are never trained (padding, the last token of each sequence,
    with ``scored`` set the prompts too) to e = E, a filler.
    """

    input_ids: Tensor  # (R, W)
    position_ids: Tensor  # (R, W), restarting at 0 for each sequence (and the row's padding)
    scored: Tensor | None  # (R, W) bool: positions whose logits are computed; None: all (K=R*W)
    targets: Tensor  # (E,)
    temperature: Tensor  # (E,)
    index: Tensor  # (B, T-1) into [0, E]
    kept: Tensor | None = None  # (E,) into [0, K): one position can predict several entries
    attention_mask: Tensor | None = None  # (R, 1, W, W) bool, True: may attend; None: from
    # the restarting position_ids (block-diagonal causal)


@dataclass
class MicroBatch:
    """Padded tensors; the T-1 next-token positions are aligned as in loss.LossInputs."""

    input_ids: Tensor  # (B, T)
    attention_mask: Tensor  # (B, T)
    targets: Tensor  # (B, T-1)
    mask: Tensor  # (B, T-1) float
    advantages: Tensor  # (B, T-1)
    inference_logprobs: Tensor  # (B, T-1)
    has_inference: Tensor  # (B,) bool
    ref_logprobs: Tensor | None  # (B, T-1), when every row carries them
    temperature: Tensor  # (B,)
    sft: Tensor  # (B,) bool
    packed: PackedRows | None = None  # set: the forward runs on these rows, not input_ids
    distill_ids: Tensor | None = None  # (B, T-1, K) teacher ids of each target, -1: none
    distill_logprobs: Tensor | None = None  # (B, T-1, K)

    def to(self, device: torch.device) -> MicroBatch:
        return MicroBatch(**_moved(self, device))


def _moved(obj: Any, device: torch.device) -> dict[str, Any]:
    """A dataclass's fields with every tensor (also in a nested dataclass) on ``device``."""
    out: dict[str, Any] = {}
    for key, value in vars(obj).items():
        if isinstance(value, Tensor):
            value = value.to(device)
        elif isinstance(value, PackedRows):
            value = PackedRows(**_moved(value, device))
        out[key] = value
    return out


def _collate_distill(samples: Sequence[Sample], t: int) -> tuple[Tensor | None, Tensor | None]:
    """(B, T-1, K) next-token aligned teacher arrays, or None when no sample has them."""
    with_teacher = [s for s in samples if s.distill_ids is not None]
    if not with_teacher:
        return None, None
    k = max(s.distill_ids.shape[1] for s in with_teacher)  # type: ignore[union-attr]
    ids = np.full((len(samples), t, k), -1, np.int64)
    lps = np.zeros((len(samples), t, k), np.float32)
    for r, s in enumerate(samples):
        if s.distill_ids is not None and s.distill_logprobs is not None:
            n, width = s.distill_ids.shape
            ids[r, : n - 1, :width] = s.distill_ids[1:]  # row p scores token p: target of p-1
            lps[r, : n - 1, :width] = s.distill_logprobs[1:]
    return torch.from_numpy(ids[:, : t - 1]), torch.from_numpy(lps[:, : t - 1])


def collate(samples: Sequence[Sample], pad_to: int | None = None) -> MicroBatch:
    """Right-pad to the longest row (or to ``pad_to``, for the naive baseline)."""
    b, t = len(samples), max(pad_to or 0, *(len(s.tokens) for s in samples))
    ids = np.zeros((b, t), np.int64)
    attn = np.zeros((b, t), np.int64)
    labels = np.full((b, t), MASK_IGNORE_INDEX, np.int64)
    adv = np.zeros((b, t), np.float32)
    inf = np.zeros((b, t), np.float32)
    ref = np.zeros((b, t), np.float32)
    for r, s in enumerate(samples):
        n = len(s.tokens)
        ids[r, :n], attn[r, :n], labels[r, :n], adv[r, :n] = s.tokens, 1, s.labels, s.advantages
        if s.inference_logprobs is not None:
            inf[r, :n] = s.inference_logprobs
        if s.ref_logprobs is not None:
            ref[r, :n] = s.ref_logprobs
    weight = torch.tensor([s.weight for s in samples], dtype=torch.float32)
    mask = torch.from_numpy(labels[:, 1:] != MASK_IGNORE_INDEX).float() * weight[:, None]
    all_ref = all(s.ref_logprobs is not None for s in samples)
    distill_ids, distill_lp = _collate_distill(samples, t)
    return MicroBatch(
        distill_ids=distill_ids,
        distill_logprobs=distill_lp,
        input_ids=torch.from_numpy(ids),
        attention_mask=torch.from_numpy(attn),
        targets=torch.from_numpy(ids[:, 1:].copy()),
        mask=mask,
        advantages=torch.from_numpy(adv[:, 1:].copy()),
        inference_logprobs=torch.from_numpy(inf[:, 1:].copy()),
        has_inference=torch.tensor([s.inference_logprobs is not None for s in samples]),
        ref_logprobs=torch.from_numpy(ref[:, 1:].copy()) if all_ref else None,
        temperature=torch.tensor([s.temperature for s in samples], dtype=torch.float32),
        sft=torch.tensor([s.sft for s in samples]),
    )
