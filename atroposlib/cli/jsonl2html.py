"""``jsonl2html``: a scored-groups dump (env ``process`` output) as one HTML page.

    jsonl2html groups.jsonl                 # writes groups.html next to it
    jsonl2html groups.jsonl report.html --title "run 12"

Uses the same renderer as the env ``process`` command. A line that is not a JSON object with
``scores`` is skipped with a warning naming it; exit 1 when no group is left.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from atroposlib.cli._flags import build_parser, fail, parse_settings
from atroposlib.utils.html_report import render_groups_html

PROG = "jsonl2html"


class Jsonl2HtmlSettings(BaseSettings):
    """``input_path`` and ``output_path`` are positional arguments."""

    model_config = SettingsConfigDict(env_prefix="ATROPOS_JSONL2HTML_", extra="forbid")

    input_path: Path = Field(description="JSONL file of scored groups, one group per line.")
    output_path: Path | None = Field(
        default=None, description="HTML file to write (default: the input path with .html)."
    )
    title: str | None = Field(default=None, description="Page title (default: the file name).")


def _groups(path: Path, skipped: list[str]) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                group = json.loads(line)
            except json.JSONDecodeError as err:
                skipped.append(f"{path}:{number}: not JSON ({err.msg})")
                continue
            items = group if isinstance(group, list) else [group]
            for item in items:
                if isinstance(item, dict) and isinstance(item.get("scores"), list):
                    yield item
                else:
                    skipped.append(f"{path}:{number}: not a group (needs a 'scores' list)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser(
        Jsonl2HtmlSettings,
        PROG,
        "Render a JSONL dump of scored groups as one HTML page.",
        positional=("input_path", "output_path"),
    )
    settings = parse_settings(Jsonl2HtmlSettings, parser, argv)
    source = settings.input_path
    if not source.is_file():
        fail(PROG, f"{source}: no such file", status=2)
    target = settings.output_path or source.with_suffix(".html")
    if target.resolve() == source.resolve():
        fail(PROG, f"the output {target} would overwrite the input; pass another path", status=2)
    skipped: list[str] = []
    try:
        groups = list(_groups(source, skipped))
    except (OSError, UnicodeDecodeError) as err:
        fail(PROG, f"{source}: {err}")
    for reason in skipped:
        print(f"{PROG}: warning: skipped {reason}", file=sys.stderr)
    if not groups:
        fail(PROG, f"{source}: no group to render")
    try:
        target.write_text(render_groups_html(groups, settings.title or source.name), "utf-8")
    except OSError as err:
        fail(PROG, f"{target}: {err}")
    print(f"{PROG}: wrote {len(groups)} groups to {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
