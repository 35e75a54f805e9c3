"""``jsonl2html``: a scored-groups dump (env ``process`` output) as one HTML page.

    jsonl2html groups.jsonl                 # writes groups.html next to it
    jsonl2html groups.jsonl report.html --title "run 12"

Uses the same renderer as the env ``process`` command. A line that is not a JSON object with
``scores`` is skipped with a warning naming it; exit 1 when no group is left.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, CliPositionalArg, SettingsConfigDict

from atroposlib.utils.cli import exit_with_error, parse_command_line
from atroposlib.utils.html_report import read_groups, render_groups_html

PROG = "jsonl2html"


class Jsonl2HtmlSettings(BaseSettings):
    """``input_path`` and ``output_path`` are positional arguments."""

    model_config = SettingsConfigDict(env_prefix="ATROPOS_JSONL2HTML_", extra="forbid")

    input_path: CliPositionalArg[Path] = Field(
        description="JSONL file of scored groups, one group per line."
    )
    output_path: CliPositionalArg[Path | None] = Field(
        default=None, description="HTML file to write (default: the input path with .html)."
    )
    title: str | None = Field(default=None, description="Page title (default: the file name).")


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_command_line(
        Jsonl2HtmlSettings,
        argv,
        PROG,
        description="Render a JSONL dump of scored groups as one HTML page.",
    )
    source = settings.input_path
    if not source.is_file():
        exit_with_error(PROG, f"{source}: no such file")
    target = settings.output_path or source.with_suffix(".html")
    if target.resolve() == source.resolve():
        exit_with_error(PROG, f"the output {target} would overwrite the input; pass another path")
    try:
        groups, skipped = read_groups(source)
    except (OSError, UnicodeDecodeError) as err:
        exit_with_error(PROG, f"{source}: {err}", status=1)
    for reason in skipped:
        print(f"{PROG}: warning: skipped {reason}", file=sys.stderr)
    if not groups:
        exit_with_error(PROG, f"{source}: no group to render", status=1)
    try:
        target.write_text(render_groups_html(groups, settings.title or source.name), "utf-8")
    except OSError as err:
        exit_with_error(PROG, f"{target}: {err}", status=1)
    print(f"{PROG}: wrote {len(groups)} groups to {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
