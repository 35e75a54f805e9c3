"""Atropos 0.4's ``get_std_min_max_avg``: summary statistics added to a metrics dict."""

from __future__ import annotations

from typing import Any

import numpy as np


def get_std_min_max_avg(name: str, data: list[Any], metrics_dict: dict[str, Any]) -> dict[str, Any]:
    """Add ``<name>_mean/_std/_max/_min`` of the finite values of ``data`` to ``metrics_dict``
    and return it. One NaN or infinite score no longer turns all four into NaN, and an empty
    window gives four NaN instead of numpy's ValueError out of ``wandb_log`` (Atropos 0.4
    did both: its PR #351).

    >>> get_std_min_max_avg("x", [1.0, 3.0, float("nan")], {})
    {'x_mean': 2.0, 'x_std': 1.0, 'x_max': 3.0, 'x_min': 1.0}
    >>> get_std_min_max_avg("x", [], {})
    {'x_mean': nan, 'x_std': nan, 'x_max': nan, 'x_min': nan}
    """
    values = np.asarray(data, dtype=float).ravel()
    values = values[np.isfinite(values)]
    stats = (
        [values.mean(), values.std(), values.max(), values.min()] if values.size else [np.nan] * 4
    )
    for suffix, value in zip(("mean", "std", "max", "min"), stats, strict=True):
        metrics_dict[f"{name}_{suffix}"] = float(value)
    return metrics_dict
