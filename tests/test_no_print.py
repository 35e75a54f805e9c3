"""Library code logs, it does not print: no call to the builtin ``print`` (nor its disguise,
``sys.stdout.write`` / ``sys.stderr.write``) in ``atroposlib/`` outside the command-line layer.

Allowed: ``atroposlib/cli/`` (the installed commands), a package's ``cli.py`` (the env scripts'
command line, the argument parser's one-line error) and a module's ``main()`` (the report of a
``python -m atroposlib....`` entry point, e.g. the test model's path). A ``print(`` inside a
string (the sandbox's probe programs, a doctest) is not a call and does not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

LIBRARY = Path(__file__).resolve().parents[1] / "atroposlib"


def _is_print(call: ast.Call) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id == "print"
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "write"
        and isinstance(func.value, ast.Attribute)
        and func.value.attr in ("stdout", "stderr")
        and isinstance(func.value.value, ast.Name)
        and func.value.value.id == "sys"
    )


def prints_outside_main(source: str) -> list[int]:
    """Lines of the print calls in ``source`` that are not inside a function named ``main``."""
    found: list[int] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and child.name == "main":
                continue
            if isinstance(child, ast.Call) and _is_print(child):
                found.append(child.lineno)
            visit(child)

    visit(ast.parse(source))
    return sorted(found)


def test_library_code_does_not_print() -> None:
    offenders = [
        f"{path.relative_to(LIBRARY.parent)}:{line}"
        for path in sorted(LIBRARY.rglob("*.py"))
        if "cli" not in path.relative_to(LIBRARY).parts and path.name != "cli.py"
        for line in prints_outside_main(path.read_text(encoding="utf-8"))
    ]
    assert not offenders, (
        "print in library code: log instead (logger = logging.getLogger(__name__)), or move "
        "the output behind atroposlib/cli/: " + ", ".join(offenders)
    )


def test_the_check_sees_calls_not_strings_and_lets_main_report() -> None:
    source = '''
import sys
PROBE = "print('ok')"
def helper():
    """>>> print(1)"""
    print("hello")
    sys.stderr.write("oops")
    console.print("a rich table is not the builtin")
def main():
    print("the entry point's report")
    sys.stdout.write("too")
'''
    assert prints_outside_main(source) == [6, 7]
