"""Atropos 0.4's ``get_std_min_max_avg``: summary statistics added to a metrics dict."""

from __future__ import annotations

from typing import Any

import numpy as np


def get_std_min_max_avg(name: str, data: list[Any], metrics_dict: dict[str, Any]) -> dict[str, Any]:
    """Add ``<name>_mean/_std/_max/_min`` of ``data`` to ``metrics_dict`` and return it.

    >>> get_std_min_max_avg("x", [1.0, 3.0], {})
    {'x_mean': 2.0, 'x_std': 1.0, 'x_max': 3.0, 'x_min': 1.0}
    """
    values = np.asarray(data, dtype=float)
    metrics_dict[f"{name}_mean"] = float(values.mean())
    metrics_dict[f"{name}_std"] = float(values.std())
    metrics_dict[f"{name}_max"] = float(values.max())
    metrics_dict[f"{name}_min"] = float(values.min())
    return metrics_dict
