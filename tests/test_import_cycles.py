"""No import cycles anywhere in the repository: every ``.py`` file under the folders below, with
module-level and function-level imports alike (an import inside a function closes a cycle as
surely as one at the top, only later), relative imports resolved against the file's package.

An absolute import is looked up from the repository root first, then where the scripts and tests
that import their neighbours by bare name (``from trainer_helpers import ...``, ``from gpu_check
import ...``) find them (:class:`_Finder`). Names found nowhere in the repository (the standard
library, installed packages such as ``vllm``) are not followed. As in Python, ``a/__init__.py``
importing its own submodules is no cycle.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("atroposlib", "example_trainer", "benchmarks", "scripts", "tests", "environments")

Graph = dict[Path, dict[Path, int]]
"""file -> {file it imports: line of the first such import}"""


def python_files(root: Path, folders: tuple[str, ...] = FOLDERS) -> list[Path]:
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root).parts
            if not any(p.startswith(".") or p in ("__pycache__", "node_modules") for p in parts):
                found.append(path)
    return found


def _module_file(base: Path, dotted: str, known: set[Path]) -> Path | None:
    """The file ``dotted`` names below ``base``, else the one its longest prefix names."""
    parts = dotted.split(".")
    while parts:
        stem = base.joinpath(*parts)
        for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
            if candidate in known:
                return candidate
        parts.pop()
    return None


def _imported_names(node: ast.Import | ast.ImportFrom, path: Path, root: Path) -> Iterator[str]:
    """Dotted names an import statement may load (relative ones made absolute from ``root``)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    module = node.module or ""
    if node.level:
        package = path.parent.relative_to(root).parts
        package = package[: len(package) - node.level + 1]
        module = ".".join([*package, module] if module else package)
    yield from (f"{module}.{alias.name}" for alias in node.names)
    yield module


class _Finder:
    """Where an absolute import is looked up from a file: the repository root; then the folder
    that holds the file's top package (or the file itself, outside a package), as ``python
    path/to/script.py`` puts it on ``sys.path``; then, outside a package, the one folder
    outside a package that holds such a module (tests put other folders on ``sys.path``)."""

    def __init__(self, root: Path, files: list[Path]) -> None:
        self.root, self.known = root, set(files)
        self.by_name: dict[str, list[Path]] = {}
        for path in files:
            if path.name == "__init__.py":
                name, folder = path.parent.name, path.parent.parent
            else:
                name, folder = path.stem, path.parent
            if folder != root and not self._in_package(folder):
                self.by_name.setdefault(name, []).append(folder)

    def _in_package(self, folder: Path) -> bool:
        return folder / "__init__.py" in self.known

    def container(self, path: Path) -> Path:
        folder = path.parent
        while folder != self.root and self._in_package(folder):
            folder = folder.parent
        return folder

    def __call__(self, name: str, path: Path, relative: bool) -> Path | None:
        found = _module_file(self.root, name, self.known)
        if found is not None or relative:
            return found
        container = self.container(path)
        if container != self.root:
            found = _module_file(container, name, self.known)
        if found is None and not self._in_package(path.parent) and path.parent != self.root:
            folders = self.by_name.get(name.split(".")[0], [])
            if len(folders) == 1:
                found = _module_file(folders[0], name, self.known)
        return found


def import_graph(root: Path, files: list[Path]) -> Graph:
    resolve = _Finder(root, files)
    graph: Graph = {path: {} for path in files}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            relative = isinstance(node, ast.ImportFrom) and node.level > 0
            for name in _imported_names(node, path, root):
                target = resolve(name, path, relative)
                if target is None or target == path:
                    continue
                if path.name == "__init__.py" and path.parent in target.parents:
                    continue  # a package importing its own parts
                graph[path].setdefault(target, node.lineno)
    return graph


def cycles(graph: Graph) -> list[list[Path]]:
    """One cycle (first file repeated at the end) for each group of files that import each other
    round (the strongly connected components of more than one file, Tarjan's algorithm)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    groups: list[set[Path]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while (member := stack.pop()) != node:
                        group.add(member)
                    groups.append(group | {node})
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                work.append((child, iter(graph[child])))
            elif child in stack:
                low[node] = min(low[node], index[child])
    return [_cycle_in(graph, group) for group in groups if len(group) > 1]


def _cycle_in(graph: Graph, group: set[Path]) -> list[Path]:
    """A shortest way round from the group's first file back to it (breadth first)."""
    start = min(group)
    came_from: dict[Path, Path] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in graph[node]:
                if child == start:
                    way = [node]
                    while way[-1] != start:
                        way.append(came_from[way[-1]])
                    return [*reversed(way), start]
                if child in group and child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no way round {sorted(group)}")


def describe(graph: Graph, cycle: list[Path], root: Path) -> str:
    steps = [
        f"{a.relative_to(root)}:{graph[a][b]} imports {b.relative_to(root)}"
        for a, b in itertools.pairwise(cycle)
    ]
    return "\n    ".join(steps)


def test_the_repository_has_no_import_cycle() -> None:
    graph = import_graph(REPO, python_files(REPO))
    found = cycles(graph)
    report = "\n  ".join(describe(graph, cycle, REPO) for cycle in found)
    assert not found, (
        f"{len(found)} import cycle(s); break each (move what both need into a "
        f"module of its own):\n  {report}"
    )


def test_the_checker_finds_a_cycle_closed_by_a_function_level_relative_import(
    tmp_path: Path,
) -> None:
    package = tmp_path / "benchmarks"
    package.mkdir()
    (package / "__init__.py").write_text("from .a import run\n")
    (package / "a.py").write_text("import json\nfrom benchmarks.b import helper\n")
    (package / "b.py").write_text("def helper():\n    from .a import run\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("from benchmarks import a\n")
    graph = import_graph(tmp_path, python_files(tmp_path, ("benchmarks", "tests")))
    found = cycles(graph)
    assert [[p.name for p in cycle] for cycle in found] == [["a.py", "b.py", "a.py"]]
    assert describe(graph, found[0], tmp_path) == (
        "benchmarks/a.py:2 imports benchmarks/b.py\n    benchmarks/b.py:2 imports benchmarks/a.py"
    )


def test_a_neighbour_imported_by_bare_name_is_followed(tmp_path: Path) -> None:
    folder = tmp_path / "tests" / "trainer"
    folder.mkdir(parents=True)
    (folder / "helpers.py").write_text("from test_one import CONSTANT\n")
    (folder / "test_one.py").write_text("CONSTANT = 1\n\ndef test():\n    import helpers\n")
    graph = import_graph(tmp_path, python_files(tmp_path, ("tests",)))
    assert [[p.name for p in c] for c in cycles(graph)] == [
        ["helpers.py", "test_one.py", "helpers.py"]
    ]
