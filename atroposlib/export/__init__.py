"""Exporting scored groups as training data: SFT lines and DPO pairs (``atropos-*-gen``)."""

from atroposlib.export.groups import GroupFileError, plain_group, read_group_files
from atroposlib.export.lines import LineOptions, dpo_lines, sft_lines
from atroposlib.export.runner import ExportResult, OutputExistsError, open_output, run_export
from atroposlib.export.selection import ScoreFilters, pair_best_worst, select_top_n
from atroposlib.export.sources import BrokerRegistration, BrokerSource, FileSource

__all__ = [
    "BrokerRegistration",
    "BrokerSource",
    "ExportResult",
    "FileSource",
    "GroupFileError",
    "LineOptions",
    "OutputExistsError",
    "ScoreFilters",
    "dpo_lines",
    "open_output",
    "pair_best_worst",
    "plain_group",
    "read_group_files",
    "run_export",
    "select_top_n",
    "sft_lines",
]
