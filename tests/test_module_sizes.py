"""Every library module says what it holds, and one over 500 lines says why (STYLE.md size budget).

The library is every ``.py`` file under ``atroposlib/`` and ``example_trainer/``. A module over
``MAX_LINES`` lines passes only if its docstring has a line starting with ``REASON_MARKER``,
e.g. ``Over 500 lines because one class keeps the queue, batch, ack and env-share invariants.``
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("atroposlib", "example_trainer")
MAX_LINES = 500
REASON_MARKER = "Over 500 lines because "


def library_modules() -> list[Path]:
    return sorted(path for top in LIBRARY for path in (REPO / top).rglob("*.py"))


def docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))


def test_the_library_is_found() -> None:
    assert len(library_modules()) > 100


def test_every_module_has_a_docstring() -> None:
    missing = [str(p.relative_to(REPO)) for p in library_modules() if not docstring(p)]
    assert not missing, f"add a module docstring whose first line says what it holds: {missing}"


def test_modules_over_the_budget_say_why() -> None:
    unexplained = []
    for path in library_modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines <= MAX_LINES:
            continue
        reasons = (docstring(path) or "").splitlines()
        if not any(line.strip().startswith(REASON_MARKER) for line in reasons):
            unexplained.append(f"{path.relative_to(REPO)} ({lines} lines)")
    assert not unexplained, (
        f"split these modules, or add a docstring line '{REASON_MARKER}...': {unexplained}"
    )
