"""The shared shell of ``atropos-sft-gen`` and ``atropos-dpo-gen``: flags, source, progress.

Exit status: 0 lines written; 1 nothing written or the source failed (broker unreachable,
a bad dump line); 2 bad flags or an existing output file without ``--append-to-previous``;
130 interrupted (lines written so far are kept and complete).
"""

from __future__ import annotations

import atexit
import functools
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from atroposlib.errors import BrokerError
from atroposlib.export.groups import GroupFileError, read_group_files
from atroposlib.export.lines import LineOptions, dpo_lines, sft_lines
from atroposlib.export.runner import ExportResult, OutputExistsError, open_output, run_export
from atroposlib.export.selection import ScoreFilters
from atroposlib.export.settings import DpoSettings, ExportSettings, SftSettings
from atroposlib.export.sources import (
    BrokerRegistration,
    BrokerSource,
    FileSource,
    GroupSource,
    reset_broker,
)
from atroposlib.export.text import Decoder
from atroposlib.utils.cli import exit_with_error, parse_command_line

Kind = Literal["sft", "dpo"]
_PROG: dict[Kind, str] = {"sft": "atropos-sft-gen", "dpo": "atropos-dpo-gen"}
_DESCRIPTION: dict[Kind, str] = {
    "sft": "Write SFT data (best sequences of each scored group) from a broker or JSONL dumps.",
    "dpo": "Write DPO pairs (best vs worst of each scored group) from a broker or JSONL dumps.",
}


def _load_decoder(prog: str, name: str) -> Decoder:
    from transformers import AutoTokenizer

    try:
        tokenizer: Decoder = AutoTokenizer.from_pretrained(name)  # type: ignore[assignment]
    except (OSError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        exit_with_error(prog, f"--tokenizer {name}: cannot load it ({first_line})")
    return tokenizer


def _source(settings: ExportSettings, prog: str) -> GroupSource:
    if settings.input:
        return FileSource(settings.input)
    from atroposlib.client import TrainerClient

    client = TrainerClient(settings.api_url, settings.api_key, encoding="msgpack")
    atexit.register(client.close)
    reset = (
        functools.partial(reset_broker, settings.api_url, settings.api_key)
        if settings.reset_broker
        else None
    )
    return BrokerSource(
        client,
        BrokerRegistration(
            batch_size=settings.batch_size,
            max_token_len=settings.max_token_len,
            name=prog,
            num_steps=settings.num_seqs_to_save,
        ),
        poll_interval=settings.poll_interval,
        idle_timeout=settings.idle_timeout,
        reset_first=reset,
    )


def _options(settings: ExportSettings) -> LineOptions:
    per_group = (
        settings.save_top_n_per_group
        if isinstance(settings, SftSettings)
        else settings.save_n_pairs_per_group
        if isinstance(settings, DpoSettings)
        else 1
    )
    return LineOptions(
        filters=ScoreFilters(
            allow_negative_scores=settings.allow_negative_scores,
            minimum_score_diff=settings.minimum_score_diff_max_min,
        ),
        per_group=per_group,
        save_messages=settings.save_messages,
        max_token_len=settings.max_token_len,
    )


def _summary(result: ExportResult, settings: ExportSettings) -> str:
    path = settings.filepath
    skipped = ", ".join(f"{reason} {count}" for reason, count in sorted(result.skipped.items()))
    ending = ""
    if result.source_exhausted:
        ending = (
            " (input exhausted)"
            if settings.input
            else f" (no batch for {settings.idle_timeout:g} s)"
        )
    return (
        f"wrote {result.lines_written} lines to {path} from {result.groups_read} groups{ending}"
        + (f"; skipped: {skipped}" if skipped else "")
    )


def _dry_run(settings: ExportSettings, prog: str) -> None:
    try:
        if settings.input:
            count = sum(1 for _ in read_group_files(settings.input))
            found = f"{count} valid groups in {', '.join(settings.input)}"
        else:
            headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
            response = httpx.get(f"{settings.api_url.rstrip('/')}/status", headers=headers)
            response.raise_for_status()
            found = f"broker at {settings.api_url} answers: {response.json()}"
    except (GroupFileError, OSError) as err:
        exit_with_error(prog, str(err), status=1)
    except httpx.HTTPError as err:
        exit_with_error(prog, f"broker at {settings.api_url}: {err}", status=1)
    print(
        f"{prog}: dry run ok: {found}; tokenizer loaded; nothing registered or written",
        file=sys.stderr,
    )


def _drop_if_empty(path: Path, created: bool) -> None:
    """Remove an output file this run created but left empty, so a retry is not refused."""
    if created and path.exists() and path.stat().st_size == 0:
        path.unlink()


_EPILOG = (
    "Exit status: 0 lines written; 1 nothing written, or the broker/dump failed; 2 bad flags "
    "or an existing output without --append-to-previous; 130 interrupted (written lines kept)."
)


def main(kind: Kind, argv: Sequence[str] | None = None) -> None:
    prog = _PROG[kind]
    model: type[ExportSettings] = SftSettings if kind == "sft" else DpoSettings
    settings = parse_command_line(model, argv, prog, description=_DESCRIPTION[kind], epilog=_EPILOG)
    logging.basicConfig(level=logging.WARNING, format=f"{prog}: %(message)s")
    if settings.filepath.exists() and not settings.append_to_previous:
        exit_with_error(
            prog,
            f"{settings.filepath} already exists; pass --append-to-previous to add to "
            "it, or choose another output path",
        )
    decoder = None if settings.save_messages else _load_decoder(prog, str(settings.tokenizer))
    if settings.dry_run:
        _dry_run(settings, prog)
        return
    make = sft_lines if kind == "sft" else dpo_lines
    options = _options(settings)
    console = Console(stderr=True)
    progress = Progress(
        SpinnerColumn(),
        TextColumn(f"[bold]{kind.upper()}[/bold] lines"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("groups {task.fields[groups]} · skipped {task.fields[skipped]}"),
        TimeElapsedColumn(),
        console=console,
        disable=settings.quiet or not console.is_terminal,
    )
    task = progress.add_task("export", total=settings.num_seqs_to_save, groups=0, skipped=0)

    def report(result: ExportResult) -> None:
        progress.update(
            task,
            completed=result.lines_written,
            groups=result.groups_read,
            skipped=sum(result.skipped.values()),
        )

    result = ExportResult()
    created = not settings.filepath.exists()
    try:
        source = _source(settings, prog)
        with (
            open_output(settings.filepath, append=settings.append_to_previous) as output,
            progress,
        ):
            result = run_export(
                source,
                lambda group, skipped: make(group, options, decoder, skipped),
                output,
                settings.num_seqs_to_save,
                on_progress=report,
                partial=result,
            )
    except OutputExistsError as err:
        exit_with_error(prog, str(err))
    except (GroupFileError, BrokerError, httpx.HTTPError, OSError) as err:
        _drop_if_empty(settings.filepath, created)
        where = f"broker at {settings.api_url}: " if isinstance(err, httpx.HTTPError) else ""
        exit_with_error(prog, f"{where}{err}; {_summary(result, settings)}", status=1)
    except KeyboardInterrupt:
        _drop_if_empty(settings.filepath, created)
        print(f"{prog}: interrupted; {_summary(result, settings)}", file=sys.stderr)
        raise SystemExit(130) from None
    print(f"{prog}: {_summary(result, settings)}", file=sys.stderr)
    if result.lines_written == 0:
        _drop_if_empty(settings.filepath, created)
        raise SystemExit(1)
