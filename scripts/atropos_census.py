"""Static census of Atropos's environment files against our atroposlib.

For each ``*.py`` under ``<atropos>/environments`` that imports atroposlib: every imported
name is resolved in Atropos's own source tree (``<atropos>/atroposlib``, read with ``ast``),
then imported from ours. The same is done for what the files use from those names:
``self.<x>`` of BaseEnv, ``self.config.<x>`` of BaseEnvConfig, ``self.server.<x>`` of
ServerManager (when the file does not define ``x`` itself) and ``<Name>.<x>`` of imported
classes, modules and module-level objects (``registry.create``).

    python scripts/atropos_census.py --atropos PATH/TO/atropos [--json out.json]

PATH is a checkout of NousResearch/atropos. Prints the totals and every use that resolves on
Atropos and fails on ours; exits 1 when there is one. Nothing of Atropos is copied.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atropos_names import SourceTree, our_object

BASE = "atroposlib.envs.base"
MANAGER = "atroposlib.envs.server_handling.server_manager"


@dataclass
class Use:
    kind: str  # import, attribute, self, config, server
    target: str  # e.g. atroposlib.envs.base:BaseEnv or BaseEnv.perf_stats
    file: str
    atropos: bool
    ours: bool


def has_member(obj: Any, name: str) -> bool:
    """Like hasattr, without running properties (a tokenizer property would load a model)."""
    owners = [obj, *(type(obj).__mro__ if not isinstance(obj, type) else obj.__mro__)]
    return any(name in getattr(owner, "__dict__", {}) for owner in owners)


def our_probes() -> dict[str, Any]:
    from atroposlib.envs.base import BaseEnv, BaseEnvConfig

    class Probe(BaseEnv):
        async def get_next_item(self) -> None:
            return None

    env = Probe(BaseEnvConfig(use_wandb=False), [], testing=True)
    return {"self": env, "server": env.server, "config": set(BaseEnvConfig.model_fields)}


def _is_self_store(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == "self")  # fmt: skip


def defined_in(tree: ast.Module) -> set[str]:
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    own.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    own.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    own |= {t.id for t in item.targets if isinstance(t, ast.Name)}
        if _is_self_store(node):
            own.add(node.attr)  # type: ignore[attr-defined]
    return own


def self_uses(tree: ast.Module, holder: str | None) -> set[str]:
    """``self.x`` (holder None) or ``self.<holder>.x`` loads."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if holder is None and isinstance(value, ast.Name) and value.id == "self":
            found.add(node.attr)
        elif (
            holder is not None
            and isinstance(value, ast.Attribute)
            and value.attr == holder
            and isinstance(value.value, ast.Name)
            and value.value.id == "self"
        ):
            found.add(node.attr)  # fmt: skip
    return found


def census_file(path: Path, rel: str, atropos: SourceTree, probes: dict[str, Any]) -> list[Use]:
    tree = ast.parse(path.read_text())
    uses: list[Use] = []
    imported: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("atroposlib"):
            for alias in node.names:
                module = node.module or ""
                ok_a = atropos.resolves(module, alias.name)
                ok_o = our_object(module, alias.name)[0]
                uses.append(Use("import", f"{module}:{alias.name}", rel, ok_a, ok_o))
                imported[alias.asname or alias.name] = (module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("atroposlib"):
                    ok_a = atropos.module_file(alias.name) is not None
                    uses.append(
                        Use("import", alias.name, rel, ok_a, our_object(alias.name, None)[0])
                    )
    uses += attribute_uses(tree, rel, imported, atropos)
    if any(module == BASE and name == "BaseEnv" for module, name in imported.values()):
        own = defined_in(tree)
        checks = (
            ("self", None, atropos.class_members(BASE, "BaseEnv"),
             lambda x: has_member(probes["self"], x)),
            ("config", "config", atropos.class_members(BASE, "BaseEnvConfig"),
             lambda x: x in probes["config"]),
            ("server", "server", atropos.class_members(MANAGER, "ServerManager"),
             lambda x: has_member(probes["server"], x)),
        )  # fmt: skip
        for kind, holder, theirs, ours in checks:
            for attr in sorted(self_uses(tree, holder) - own):
                if attr in theirs:
                    uses.append(Use(kind, f"{kind}.{attr}", rel, True, bool(ours(attr))))
    return uses


def attribute_uses(
    tree: ast.Module, rel: str, imported: dict[str, tuple[str, str | None]], atropos: SourceTree
) -> list[Use]:
    uses = []
    seen = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
            continue
        if node.value.id not in imported or (node.value.id, node.attr) in seen:
            continue
        seen.add((node.value.id, node.attr))
        module, name = imported[node.value.id]
        if name is None or not atropos.resolves(module, name):
            continue
        theirs = their_members(atropos, module, name)
        if node.attr not in theirs:
            continue
        found, obj = our_object(module, name)
        uses.append(Use("attribute", f"{module}:{name}.{node.attr}", rel, True,
                        found and has_member(obj, node.attr)))  # fmt: skip
    return uses


def their_members(atropos: SourceTree, module: str, name: str) -> set[str]:
    if atropos.module_file(f"{module}.{name}") is not None:
        return set(atropos.bindings(f"{module}.{name}"))
    found = atropos.definition(module, name)
    if found is None:
        return set()
    if atropos.class_node(*found) is not None:
        return atropos.class_members(*found)
    instance_of = atropos.instance_class(*found)
    return atropos.class_members(*instance_of) if instance_of else set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atropos", type=Path, required=True, help="NousResearch/atropos checkout")
    parser.add_argument("--json", type=Path, help="also write every use to this file")
    args = parser.parse_args(argv)
    atropos = SourceTree(args.atropos)
    probes = our_probes()
    files = sorted(p for p in (args.atropos / "environments").rglob("*.py")
                   if "atroposlib" in p.read_text(errors="replace"))  # fmt: skip
    uses: list[Use] = []
    for path in files:
        try:
            uses += census_file(path, str(path.relative_to(args.atropos)), atropos, probes)
        except SyntaxError as exc:
            print(f"skipped {path}: {exc}", file=sys.stderr)
    env_files = {u.file for u in uses if u.kind == "import"}
    broken: dict[str, set[str]] = defaultdict(set)
    for use in uses:
        if use.atropos and not use.ours:
            broken[use.target].add(use.file)
    print(f"{len(env_files)} env files import atroposlib; {len(uses)} uses checked "
          f"({sum(u.kind == 'import' for u in uses)} imports, "
          f"{sum(u.kind != 'import' for u in uses)} attributes)")  # fmt: skip
    print(f"resolve on Atropos: {sum(u.atropos for u in uses)}; "
          f"of those, fail on ours: {sum(u.atropos and not u.ours for u in uses)} "
          f"({len(broken)} distinct names, "
          f"{len({f for fs in broken.values() for f in fs})} files)")  # fmt: skip
    unresolved = sorted({u.target for u in uses if not u.atropos})
    print(f"fail on Atropos itself (broken env files upstream): {unresolved}")
    for target, where in sorted(broken.items()):
        print(f"  MISSING {target}  ({len(where)} files: {', '.join(sorted(where)[:3])}...)")
    if args.json:
        args.json.write_text(json.dumps([asdict(u) for u in uses], indent=1))
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
