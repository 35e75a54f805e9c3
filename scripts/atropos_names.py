"""Static view of an atroposlib source tree (Atropos's, from its wheel or repository):
which names each module binds, which are public, and what members its classes have.

Shared by ``scripts/atropos_census.py`` and ``scripts/atropos_compat_report.py``. Reads
source with ``ast`` only; nothing of the analysed tree is imported or copied.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

SCOPE = ("atroposlib.envs", "atroposlib.utils", "atroposlib.type_definitions")
"""The packages the compatibility report covers (env authors' API)."""
SKIPPED_NAMES = {"logger"}


@dataclass(frozen=True)
class Binding:
    kind: str  # class, function, value, import
    source: str | None = None  # for imports: "module:name" or "module"


class SourceTree:
    """``root`` holds the ``atroposlib`` package folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def module_file(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def modules(self) -> list[str]:
        found = []
        for path in sorted((self.root / "atroposlib").rglob("*.py")):
            parts = list(path.relative_to(self.root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            module = ".".join(parts)
            if module.startswith(SCOPE) and ".tests" not in module:
                found.append(module)
        return found

    @cache  # noqa: B019 - one tree per run
    def bindings(self, module: str) -> dict[str, Binding]:
        path = self.module_file(module)
        if path is None:
            return {}
        tree = ast.parse(path.read_text())
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        out: dict[str, Binding] = {}
        for node in _top_level(tree.body):
            if isinstance(node, ast.ClassDef):
                out[node.name] = Binding("class")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                out[node.name] = Binding("function")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            out[name.id] = Binding("value")
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(node, package)
                for alias in node.names:
                    out[alias.asname or alias.name] = Binding("import", f"{source}:{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    out[alias.asname or alias.name.split(".")[0]] = Binding("import", alias.name)
        return out

    def resolves(self, module: str, name: str) -> bool:
        """Whether ``from module import name`` works in this tree."""
        if self.module_file(module) is None:
            return False
        return name in self.bindings(module) or self.module_file(f"{module}.{name}") is not None

    def public_names(self, module: str) -> dict[str, str]:
        """Public names a user can import: defined here, or re-exported from atroposlib."""
        out = {}
        for name, binding in self.bindings(module).items():
            if name.startswith("_") or name in SKIPPED_NAMES:
                continue
            if binding.kind == "import" and not (binding.source or "").startswith("atroposlib"):
                continue
            out[name] = binding.kind
        return out

    def definition(self, module: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        """(module, name) where ``name`` seen from ``module`` is really defined."""
        binding = self.bindings(module).get(name)
        if binding is None or depth > 8:
            return None
        if binding.kind != "import":
            return module, name
        source_module, _, source_name = (binding.source or "").partition(":")
        if not source_name or not source_module.startswith("atroposlib"):
            return None
        return self.definition(source_module, source_name, depth + 1)

    def class_node(self, module: str, name: str) -> ast.ClassDef | None:
        path = self.module_file(module)
        if path is None:
            return None
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return node
        return None

    def class_members(self, module: str, name: str, depth: int = 0) -> set[str]:
        """Methods, class attributes, fields and ``self.x`` assignments, bases included."""
        found = self.definition(module, name)
        node = self.class_node(*found) if found else None
        if node is None or depth > 8:
            return set()
        members: set[str] = set()
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                members.add(item.name)
            elif isinstance(item, ast.Assign | ast.AnnAssign):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                members |= {t.id for t in targets if isinstance(t, ast.Name)}
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.ctx, ast.Store)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
            ):
                members.add(sub.attr)  # fmt: skip
        assert found is not None
        for base in node.bases:
            if isinstance(base, ast.Name):
                members |= self.class_members(found[0], base.id, depth + 1)
        return members

    def instance_class(self, module: str, name: str) -> tuple[str, str] | None:
        """For ``name = SomeClass()`` at module level: where SomeClass is defined."""
        found = self.definition(module, name)
        path = self.module_file(found[0]) if found else None
        if found is None or path is None:
            return None
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and any(isinstance(t, ast.Name) and t.id == found[1] for t in node.targets)
            ):
                return self.definition(found[0], node.value.func.id)  # fmt: skip
        return None


def our_object(module: str, name: str | None = None) -> tuple[bool, Any]:
    """Whether ``from module import name`` works on the installed (our) atroposlib, and what
    it gives."""
    try:
        loaded = importlib.import_module(module)
    except Exception:
        return False, None
    if name is None:
        return True, loaded
    if hasattr(loaded, name):
        return True, getattr(loaded, name)
    try:
        return True, importlib.import_module(f"{module}.{name}")
    except Exception:
        return False, None


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Statements at module level, looking inside ``if``/``try`` blocks."""
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.If):
            out += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            out += _top_level(node.body) + _top_level(node.orelse)
            for handler in node.handlers:
                out += _top_level(handler.body)
        else:
            out.append(node)
    return out


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)
