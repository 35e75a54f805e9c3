"""Commands and flags written inline, in the docs' prose and in the library's messages, are right.

``test_doc_commands.py`` checks the fenced blocks; here the rest: a `code span` of a doc that is a
command is checked by the same rules, every ``--flag`` in a span is one a program here accepts
(read from its own parser, ``program_flags.py``), so is every flag an error message, a log line
or a docstring of the library tells the user to pass, and every file a span or a link names
exists.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.docs.doc_commands import (
    INLINE,
    REPO,
    InlineSpan,
    doc_files,
    inline_spans,
    prose_of,
)
from tests.docs.program_flags import accepted_flags
from tests.docs.test_doc_commands import INTERPRETERS, RULES, inputs_exist, program, substituted

FLAG = re.compile(r"(?<![\w./-])--[a-z][\w.-]*[a-z0-9_](?![\w-])")
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|\||(?<![\w=-])[A-Z]{1,6}(?![\w=])")
"""A span with ``<name>``, ``...``, ``a|b`` or a word in capitals (``N``, ``RUN/x.jsonl``) is a
pattern, not a command as written."""
OTHER_PROJECTS_MODULES = {"vllm", "sglang"}
"""``python -m`` of another project's package (run in that project's own venv)."""
NOTATION = {"--kebab-case", "--snake_case", "--flag", "--no-flag", "--field", "--kebab-flag",
            "--kebab-name"}  # fmt: skip
"""Words that stand for any flag, where a page or a docstring explains how flags are spelled."""
PROGRAMS = re.compile(
    r"([A-Z_]+=\S+ )*(python|\.venv/bin/python|scripts/\S+|run-api|atropos-\S+|view-run"
    r"|jsonl2html|pip|sbatch|export)( |$)"
)
"""How a span that is a command of ours starts."""
SPANS = inline_spans()


def test_the_prose_has_spans_to_check() -> None:
    assert len([s for s in SPANS if FLAG.search(s.text)]) > 100


def unknown_flags(text: str) -> list[str]:
    known = accepted_flags()
    flags = [flag.split("=")[0] for flag in FLAG.findall(PLACEHOLDER.sub(" ", text))]
    return [flag for flag in flags if flag not in known and flag not in NOTATION]


def test_every_inline_flag_is_one_a_program_accepts() -> None:
    wrong = [f"{span}: {flag}" for span in SPANS for flag in unknown_flags(span.text)]
    assert not wrong, "flags no program here accepts:\n" + "\n".join(wrong)


COMMAND_SPANS = [
    span
    for span in SPANS
    if PROGRAMS.match(span.text) and not PLACEHOLDER.search(span.text) and " " in span.text
]
"""Spans that are a command of ours with its arguments (a bare ``run-api`` is a name)."""


def test_the_prose_names_commands() -> None:
    assert len(COMMAND_SPANS) > 20


def program_exists(argv: list[str]) -> None:
    """The program a span runs is one this checkout has: a script, a console script, a module."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    name = argv[0]
    if name in INTERPRETERS:
        if argv[1] != "-m":
            assert (REPO / argv[1]).is_file(), f"no script {argv[1]}"
        elif len(argv) > 2 and argv[2].split(".")[0] not in OTHER_PROJECTS_MODULES:
            assert importlib.util.find_spec(argv[2]) is not None, f"no module {argv[2]}"
    elif name.startswith("scripts/"):
        assert (REPO / name).is_file(), f"no script {name}"
    else:
        assert name in scripts or name in {"export", "sbatch", "pip"}, f"no program {name}"


@pytest.mark.parametrize("span", COMMAND_SPANS, ids=[s.where for s in COMMAND_SPANS])
def test_inline_command(span: InlineSpan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole command (one a rule of test_doc_commands.py covers, such as ``pip install -e .``
    or ``atropos-local --steps 10``) is checked as a fenced one is; a fragment (a program and its
    sub-command, ``scripts/gpu-check run``, or ``--help``) names a program that exists, its flags
    checked above."""
    monkeypatch.chdir(REPO)
    words = shlex.split(span.text)
    argv = program(substituted(words[: words.index(">")] if ">" in words else words, tmp_path))
    rules = [rule for rule in RULES if re.match(rule.pattern, span.text)]
    partial_sbatch = argv[0] == "sbatch" and "slurm/atropos.sbatch" not in argv
    fragment = len(argv) <= 2 or "--help" in argv or partial_sbatch
    whole = bool(rules) and not fragment
    program_exists(argv)
    if whole:
        inputs_exist(argv)
        rules[0].check(argv, tmp_path)


# ---------------------------------------------------------------------------------------
# Messages: what the library tells a user to type
# ---------------------------------------------------------------------------------------

TELLS_THE_USER = re.compile(r"(error|warn|warning|info|exception|critical|exit|fail|print)$", re.I)


def _told(tree: ast.AST) -> list[ast.Constant]:
    """String pieces of raised exceptions, of calls that report (logging, exits, errors) and of
    docstrings."""
    pieces: list[ast.Constant] = []
    for node in ast.walk(tree):
        reports = isinstance(node, ast.Raise)
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", "")
            reports = bool(TELLS_THE_USER.search(name) or name.endswith(("Error", "Exception")))
        if reports:
            pieces += [c for c in ast.walk(node) if isinstance(c, ast.Constant)]
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                pieces.append(body[0].value)
    return [c for c in pieces if isinstance(c.value, str)]


def _prose(text: str) -> str:
    """A docstring without its doctest examples (their flags are a function's test inputs)."""
    return text.split(">>>")[0]


def library_files() -> list[Path]:
    return sorted([*(REPO / "atroposlib").rglob("*.py"), *(REPO / "example_trainer").rglob("*.py")])


def test_every_flag_a_message_names_is_one_a_program_accepts() -> None:
    wrong = []
    for path in library_files():
        for piece in _told(ast.parse(path.read_text())):
            for flag in unknown_flags(_prose(str(piece.value))):
                wrong.append(f"{path.relative_to(REPO)}:{piece.lineno}: {flag}")
    assert not wrong, "messages name flags no program here accepts:\n" + "\n".join(wrong)


def test_unknown_flags_are_found() -> None:
    assert unknown_flags("pass --sandbox.allow_weak_isolation or --env.nope") == [
        "--sandbox.allow_weak_isolation",
        "--env.nope",
    ]
    assert unknown_flags("`--env.sandbox.allow_weak_isolation`, `--openai.<field>`") == []


# ---------------------------------------------------------------------------------------
# Files the prose names
# ---------------------------------------------------------------------------------------

OURS = ("atroposlib/", "example_trainer/", "docs/", "tests/", "benchmarks/", "scripts/",
        "environments/", "configs/", "slurm/", ".ci/")  # fmt: skip
"""A path that starts with one of these names a file of this checkout (another project's files
are written from inside their folder: hermes-agent's ``tools/test_x.py``)."""
PATH_LIKE = re.compile(r"^[\w./-]+\.(md|py|yaml|yml|json|toml|sh|sbatch|jinja)$")
PAGE_NAME = re.compile(r"(?<![\w/.-])[\w-]+\.md\b")
LINK = re.compile(r"\[[^\]]*\]\((?P<target>[^)\s#]*)(#[^)]*)?\)")


def missing_files(page: Path, text: str) -> list[str]:
    """Files ``text`` (a page's prose) names that the checkout lacks: a span naming a file of
    ours (``docs/x.md``), a page named in the prose (``SLURM.md``), a relative link."""
    wrong = []
    prose = prose_of(text)
    for line_no, line in enumerate(prose.splitlines(), 1):
        where = f"{page.relative_to(REPO)}:{line_no}"
        for span in INLINE.findall(line):
            ours = PATH_LIKE.match(span) and span.startswith(OURS)
            if ours and not any((base / span).exists() for base in (REPO, page.parent)):
                wrong.append(f"{where}: `{span}`")
        for m in LINK.finditer(line):
            target = m.group("target")
            if target and "://" not in target and not (page.parent / target).exists():
                wrong.append(f"{where}: link {target}")
        for name in PAGE_NAME.findall(INLINE.sub("", LINK.sub("", line))):
            if not any((base / name).exists() for base in (REPO, page.parent)):
                wrong.append(f"{where}: {name}")
    return wrong


def test_every_file_a_doc_names_exists() -> None:
    wrong = [line for page in doc_files() for line in missing_files(page, page.read_text())]
    assert not wrong, "names of files not in the checkout:\n" + "\n".join(wrong)


def test_missing_files_are_found() -> None:
    page = REPO / "benchmarks" / "README.md"
    text = "see LEARNING.md and `docs/nowhere.md`, [x](../docs/results.md), [y](gone.md)\n"
    assert missing_files(page, text) == [
        "benchmarks/README.md:1: `docs/nowhere.md`",
        "benchmarks/README.md:1: link gone.md",
        "benchmarks/README.md:1: LEARNING.md",
    ]
