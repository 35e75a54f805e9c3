"""The shell commands the docs show, as the docs show them.

A command is a line of a ```bash block (backslash continuations joined, comments and a trailing
``&`` dropped). Every fenced block names its language, so no command hides in an untagged one.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)


def doc_files() -> list[Path]:
    """Every page a user reads: the top-level guides, docs/, each env's and the trainer's and
    the benchmarks' READMEs."""
    pages = [REPO / "README.md", REPO / "SLURM.md", REPO / "CONFIG.md"]
    pages += sorted((REPO / "docs").rglob("*.md"))
    pages += sorted((REPO / "environments").rglob("README.md"))
    pages += [REPO / "example_trainer" / "README.md", REPO / "benchmarks" / "README.md"]
    return [page for page in pages if page.is_file()]


@dataclass(frozen=True)
class DocCommand:
    page: Path
    line: int
    text: str  # as written, continuations joined, without its comment
    exports: tuple[tuple[str, str], ...] = ()  # ``export NAME=value`` lines above it in its block

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


@dataclass(frozen=True)
class Fence:
    page: Path
    line: int
    lang: str
    body: str


def fences(page: Path) -> list[Fence]:
    text = page.read_text()
    return [
        Fence(page, text.count("\n", 0, m.start()) + 1, m.group("lang"), m.group("body"))
        for m in FENCE.finditer(text)
    ]


def commands_in(fence: Fence) -> list[DocCommand]:
    found: list[DocCommand] = []
    exports: list[tuple[str, str]] = []
    lines = fence.body.splitlines()
    index = 0
    while index < len(lines):
        start, joined = index, lines[index]
        while joined.rstrip().endswith("\\") and index + 1 < len(lines):
            index += 1
            joined = joined.rstrip()[:-1] + " " + lines[index].strip()
        index += 1
        text = " ".join(joined[: _comment_start(joined)].split())
        text = text.removesuffix("&").rstrip()
        if text:
            found.append(DocCommand(fence.page, fence.line + 1 + start, text, tuple(exports)))
        if m := re.match(r"export (\w+)=(.*)$", text):
            exports.append((m.group(1), m.group(2)))
    return found


def _comment_start(line: str) -> int | None:
    """Where the line's comment starts (a ``#`` after a blank, outside quotes), or None."""
    quote: str | None = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return i
    return None


def doc_commands() -> list[DocCommand]:
    return [
        command
        for page in doc_files()
        for fence in fences(page)
        if fence.lang == "bash"
        for command in commands_in(fence)
    ]


def doc_command(page: str, starts: str) -> DocCommand:
    """The one command of ``page`` (relative to the checkout) that starts with ``starts``."""
    found = [c for c in doc_commands() if c.page == REPO / page and c.text.startswith(starts)]
    assert len(found) == 1, f"{page}: {len(found)} commands start with {starts!r}"
    return found[0]


def doc_commands_in_block(page: str, starts: str) -> list[DocCommand]:
    """Every command of the ```bash block of ``page`` that holds the command ``starts``."""
    first = doc_command(page, starts)
    for fence in fences(REPO / page):
        found = commands_in(fence) if fence.lang == "bash" else []
        if first in found:
            return found
    raise AssertionError(f"{page}: no block holds {starts!r}")


INLINE = re.compile(r"(?<!`)`(?P<text>[^`\n]+(?:\n[^`\n]+)?)`(?!`)")
"""A `code span`, which may wrap onto the next line of its paragraph."""


@dataclass(frozen=True)
class InlineSpan:
    page: Path
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def __str__(self) -> str:
        return f"{self.where}: `{self.text}`"


def prose_of(text: str) -> str:
    """``text`` with its fenced blocks blanked (their lines kept, so line numbers still count)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def inline_spans() -> list[InlineSpan]:
    """Every `code span` of the prose (fenced blocks left out, their lines kept for counting)."""
    found = []
    for page in doc_files():
        prose = prose_of(page.read_text())
        for m in INLINE.finditer(prose):
            line = prose.count("\n", 0, m.start()) + 1
            found.append(InlineSpan(page, line, " ".join(m.group("text").split())))
    return found
