"""Group-relative advantage helpers for environments that set advantages themselves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from atroposlib.type_definitions import number

__all__ = [
    "BoolVector",
    "NumpyArrayLike",
    "allclose_to_first",
    "compute_discounted_returns",
    "compute_grpo_process_supervision_advantages",
    "compute_stats",
    "discounted_returns",
    "group_relative_advantages",
    "grouped_advantages",
    "number",
    "token_level_advantages",
]

NumpyArrayLike = np.ndarray | Sequence[np.ndarray] | Sequence[Sequence[Any]]
"""Atropos 0.4's alias for array-like advantage inputs."""
BoolVector = np.ndarray
"""Atropos 0.4's alias for boolean numpy vectors."""


AdvantageBaseline = Literal["group_mean", "leave_one_out"]
AdvantageScale = Literal["group", "batch", "none"]


def _sample_std(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if values.size > 1 else 0.0


def grouped_advantages(
    groups: Sequence[Sequence[float]],
    baseline: AdvantageBaseline = "group_mean",
    std: AdvantageScale = "group",
    eps: float = 1e-4,
) -> list[list[float]]:
    """The one definition of GRPO-style advantages, used by the trainer and by environments.

    ``score - baseline`` (the group mean, or RLOO's mean of the other G-1 scores), divided by
    ``unbiased std + eps`` of the group (``std="group"``, GRPO), of every score in the batch
    (``"batch"``), or left unscaled (``"none"``, Dr GRPO).

    >>> grouped_advantages([[1.0, 2.0, 3.0, 6.0]], "leave_one_out", "none")[0][3]
    4.0
    >>> [[round(a, 4) for a in group] for group in grouped_advantages([[0.0, 1.0], [5.0]])]
    [[-0.707, 0.707], [0.0]]
    """
    arrays = [np.asarray(scores, dtype=np.float64) for scores in groups]
    centred = []
    for scores in arrays:
        size = scores.size
        if baseline == "group_mean" or size <= 1:
            centred.append(scores - scores.mean() if size else scores)
        else:
            centred.append(scores - (scores.sum() - scores) / (size - 1))
    if std == "none":
        return [c.tolist() for c in centred]
    if std == "batch":
        scale = _sample_std(np.concatenate(arrays)) if arrays else 0.0
        return [(c / (scale + eps)).tolist() for c in centred]
    return [(c / (_sample_std(s) + eps)).tolist() for s, c in zip(arrays, centred, strict=True)]


def group_relative_advantages(
    scores: Sequence[float], *, normalize_std: bool = True, eps: float = 1e-4
) -> list[float]:
    """GRPO advantages of one group, exactly as the trainer computes them: ``score - mean``,
    divided by the group's unbiased std plus ``eps`` when ``normalize_std``.

    >>> [round(a, 4) for a in group_relative_advantages([1.0, 0.0, 1.0, 0.0])]
    [0.8659, -0.8659, 0.8659, -0.8659]
    >>> group_relative_advantages([2.0, 2.0])
    [0.0, 0.0]
    """
    if not scores:
        return []
    return grouped_advantages([scores], "group_mean", "group" if normalize_std else "none", eps)[0]


def token_level_advantages(
    advantages: Sequence[float], masks: Sequence[Sequence[int]]
) -> list[list[float]]:
    """Spread one advantage per sequence over its trained positions (0.0 where masked).

    >>> token_level_advantages([0.5, -0.5], [[-100, 7], [-100, -100, 9]])
    [[0.0, 0.5], [0.0, 0.0, -0.5]]
    """
    return [
        [value if m != -100 else 0.0 for m in mask]
        for value, mask in zip(advantages, masks, strict=True)
    ]


def discounted_returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """Per-step returns of a multi-step episode.

    >>> discounted_returns([0.0, 0.0, 1.0], gamma=0.5)
    [0.25, 0.5, 1.0]
    """
    out: list[float] = []
    running = 0.0
    for reward in reversed(rewards):
        running = reward + gamma * running
        out.append(running)
    return out[::-1]


# ---- the Atropos 0.4 helpers, same names and behaviour --------------------------------


def allclose_to_first(
    values: Any,
    rtol: float = 1e-05,
    atol: float = 1e-08,
    equal_nan: bool = False,
    return_vector: bool = False,
) -> bool | np.ndarray:
    """Whether every entry of ``values`` is close to ``values[0]`` (or one bool per entry).

    >>> allclose_to_first([[1.0, 2.0], [1.0, 2.0 + 1e-9]]), allclose_to_first([1, 1, 2])
    (True, False)
    >>> allclose_to_first([1, 1, 2], return_vector=True).tolist()
    [True, True, False]
    """
    array = np.asarray(values)
    close = np.isclose(array, array[0], rtol=rtol, atol=atol, equal_nan=equal_nan)
    per_entry = close.reshape(close.shape[0], -1).all(axis=1)
    return per_entry if return_vector else bool(per_entry.all())


def _flatten(data: Any) -> list[float]:
    if isinstance(data, int | float):
        return [float(data)]
    if isinstance(data, list | tuple | np.ndarray):
        return [value for element in data for value in _flatten(element)]
    raise ValueError(f"Invalid element type encountered: {type(data)}")


def compute_stats(data: Sequence[Any]) -> dict[str, float]:
    """Mean and (population) variance of a possibly jagged nested list. The variance is the
    mean squared distance from the mean, never negative: Atropos 0.4's ``E[x²] - E[x]²`` gave
    -1.7e-18 for ``[0.1, 0.1, 0.1]``, a complex std downstream (its PR #481).

    >>> {k: round(v, 4) for k, v in compute_stats([[1, 2], [3]]).items()}
    {'mean': 2.0, 'var': 0.6667}
    >>> compute_stats([0.1, 0.1, 0.1])["var"] >= 0
    True
    """
    flat = _flatten(list(data))
    if not flat:
        raise ValueError("No numerical elements found in the input data.")
    mean = sum(flat) / len(flat)
    return {"mean": mean, "var": sum((v - mean) ** 2 for v in flat) / len(flat)}


def compute_discounted_returns(rewards: Any, gamma: float) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}`` for a 1-D vector of rewards.

    >>> compute_discounted_returns([0.0, 0.0, 1.0], 0.5).tolist()
    [0.25, 0.5, 1.0]
    """
    array = rewards if isinstance(rewards, np.ndarray) else np.asarray(rewards, dtype=np.float32)
    return np.asarray(discounted_returns(array.tolist(), gamma), dtype=array.dtype)


def compute_grpo_process_supervision_advantages(
    rewards: Sequence[Sequence[float]], gamma: float | None = None, std_tol: float = 1e-8
) -> list[np.ndarray]:
    """Per-step advantages: rewards normalised over the whole group, then summed to the end
    of each trajectory (discounted by ``gamma`` when given).

    >>> [a.round(3).tolist() for a in compute_grpo_process_supervision_advantages([[1, 0], [0]])]
    [[0.707, -0.707], [-0.707]]
    """
    stats = compute_stats(rewards)
    std = stats["var"] ** 0.5
    if std < std_tol:
        raise ValueError(f"`std` is smaller than tolerance of {std_tol}.")
    normalised = [(np.asarray(steps, dtype=float) - stats["mean"]) / std for steps in rewards]
    if gamma is None:
        return [np.cumsum(steps[::-1])[::-1] for steps in normalised]
    return [compute_discounted_returns(steps, gamma) for steps in normalised]
