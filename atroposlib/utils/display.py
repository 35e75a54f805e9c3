"""``display_metrics_table``: an evaluation's metrics as a table on the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def display_metrics_table(
    task_name: str | None,
    metrics: dict[str, Any],
    start_time: float,
    end_time: float,
    console: Console | None = None,
) -> None:
    """Print one row per metric, titled with the task and how long it took."""
    table = Table(title=f"{task_name or 'evaluation'} ({end_time - start_time:.1f} s)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in sorted(metrics.items()):
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    (console or Console()).print(table)
