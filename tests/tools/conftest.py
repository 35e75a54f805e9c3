"""Fixtures of the tools' tests: the real test-model tokenizer, the fixture dump, CLI runners."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.tools.fixture_groups import DATA, GROUPS_PATH


@dataclass
class ToolRun:
    code: int
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def tokenizer_dir(test_model_path: Path) -> str:
    return str(test_model_path)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture
def groups_path() -> Path:
    return GROUPS_PATH


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def expected_lines(kind: str) -> list[dict[str, Any]]:
    return read_lines(DATA / f"expected_{kind}.jsonl")


@pytest.fixture
def run_tool(capsys: pytest.CaptureFixture[str]) -> Callable[..., ToolRun]:
    """Run ``atropos-sft-gen``/``atropos-dpo-gen`` in-process; returns exit code and stderr."""
    from atroposlib.cli import dpo, sft

    def run(kind: str, *argv: str | Path) -> ToolRun:
        main = sft.main if kind == "sft" else dpo.main
        capsys.readouterr()
        try:
            main([str(arg) for arg in argv])
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        return ToolRun(code, capsys.readouterr().err)

    return run
