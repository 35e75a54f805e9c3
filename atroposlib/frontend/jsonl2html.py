"""Atropos's ``atroposlib.frontend.jsonl2html``: the HTML report of a JSONL dump of groups.

A public face over :mod:`atroposlib.utils.html_report`, the page that ``process`` and the
``jsonl2html`` command write. Every message, role and score from the file is HTML-escaped:
model output is untrusted input.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from atroposlib.utils.html_report import (
    read_groups,
    render_group_html,
    render_groups_html,
    score_range,
)

__all__ = ["create_html_for_group", "generate_html"]

logger = logging.getLogger(__name__)


def create_html_for_group(group_data: dict[str, Any], index: int) -> str:
    """One group's collapsible block (numbered ``index``): a rollout per score that has its
    messages, each a string or a chat (a list of ``{"role", "content"}``); "" when none has.

    >>> "Hi &lt;b&gt;" in create_html_for_group({"messages": ["Hi <b>"], "scores": [1.0]}, 0)
    True
    >>> create_html_for_group({"messages": [], "scores": []}, 3)
    ''
    """
    messages, scores = group_data.get("messages") or [], group_data.get("scores") or []
    if messages and len(messages) != len(scores):
        logger.warning(
            "group %d has %d messages and %d scores: showing the first %d",
            index, len(messages), len(scores), min(len(messages), len(scores)),
        )  # fmt: skip
    low, high = score_range([group_data])
    return render_group_html(group_data, index, low, high, skip_empty=True)


def generate_html(
    input_path: str | Path, output_path: str | Path | None = None, title: str | None = None
) -> Path:
    """Write every group of a JSONL dump to one HTML page (default: the input path with
    ``.html``) and return its path. Lines that are not groups are skipped with a warning;
    ValueError when none is left, FileNotFoundError when the input does not exist."""
    source = Path(input_path)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such file")
    target = Path(output_path) if output_path is not None else source.with_suffix(".html")
    if target.resolve() == source.resolve():
        raise ValueError(f"the output {target} would overwrite the input; pass another path")
    groups, skipped = read_groups(source)
    for reason in skipped:
        logger.warning("skipped %s", reason)
    if not groups:
        raise ValueError(f"{source}: no group to render (a group is a JSON object with 'scores')")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_groups_html(groups, title or source.name), encoding="utf-8")
    return target
