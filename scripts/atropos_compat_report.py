"""The compatibility report: every public name of atroposlib 0.4.0 in ``envs``, ``utils`` and
``type_definitions`` (plus the archived repository's last additions), and whether ours has it
at the same import path; public classes also by member.

    python scripts/atropos_compat_report.py refresh [--wheel W.whl] [--repo ATROPOS_CHECKOUT]
        reads the names from the 0.4.0 wheel (downloaded with pip when --wheel is not given)
        into docs/atropos-compat.json, then writes docs/atropos-compat.md
    python scripts/atropos_compat_report.py render   # docs/atropos-compat.md from the JSON
    python scripts/atropos_compat_report.py check    # exit 1 if the .md is not what ours gives

``tests/envs/test_atropos_compat_report.py`` runs ``check`` in CI, so a name that disappears
from ours fails the build. The JSON holds names only (API facts), no Atropos code.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atropos_names import SourceTree, our_object
from atropos_own_tests import RESULTS, table
from hermes_agent_envs import RESULTS as HERMES_RESULTS
from hermes_agent_envs import RESULTS_VLLM as HERMES_RESULTS_VLLM
from hermes_agent_envs import section as hermes_section

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "docs" / "atropos-compat.json"
REPORT = REPO / "docs" / "atropos-compat.md"
REPO_ONLY = ("atroposlib.envs.teacher_distillation_env",)
"""Modules of the archived repository's last version that the 0.4.0 wheel lacks."""

NOT_PROVIDED = {
    "atroposlib.envs.reward_fns.cosine_scaled_reward": "needs a sentence-embedding model from "
    "the hub; not ported",
    "atroposlib.envs.reward_fns.chandas_meter_reward": "needs the chandas package; not ported",
    "atroposlib.envs.reward_fns.r1_reward": "not ported",
    "atroposlib.envs.reward_fns.cascading_r1_math_reward": "not ported",
    "atroposlib.utils.cli": "Atropos's CLI internals (also re-exported by envs.base and the "
    "teacher env: merge_dicts, extract_namespace, ...); our CLI is envs.settings",
    "atroposlib.utils.force_diverse_samples": "not ported",
    "atroposlib.utils.tokenizers.qwen_fixed_tokenizer": "not ported",
    "atroposlib.utils.tokenizers": "not ported",
}
"""Modules we deliberately do not provide, with the reason printed in the report."""


# ---- reading Atropos's names ---------------------------------------------------------------


def manifest_from(tree: SourceTree, modules: list[str], origin: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for module in modules:
        names = {}
        for name, kind in sorted(tree.public_names(module).items()):
            entry: dict[str, Any] = {"kind": kind, "origin": origin}
            found = tree.definition(module, name)
            if kind == "class" and found and found[0] == module:
                entry["members"] = sorted(m for m in tree.class_members(module, name)
                                          if not m.startswith("_"))  # fmt: skip
            names[name] = entry
        out[module] = names
    return out


def refresh(wheel: Path | None, repo: Path | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp,
                            "atroposlib==0.4.0"], check=True)  # fmt: skip
            wheel = next(Path(tmp).glob("atroposlib-0.4.0-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(Path(tmp) / "wheel")
        tree = SourceTree(Path(tmp) / "wheel")
        modules = manifest_from(tree, tree.modules(), "0.4.0")
    if repo is not None:
        repo_tree = SourceTree(repo)
        extra = [m for m in REPO_ONLY if repo_tree.module_file(m)]
        modules.update(manifest_from(repo_tree, extra, "repository"))
    MANIFEST.write_text(json.dumps({"source": "atroposlib 0.4.0 wheel (PyPI) and the archived "
                                    "repository's last version", "modules": modules},
                                   indent=1, sort_keys=True) + "\n")  # fmt: skip


# ---- checking ours ---------------------------------------------------------------------------


def our_members(cls: type) -> set[str]:
    """Class attributes, pydantic fields, and ``self.x`` assigned in the class's code."""
    found: set[str] = set(getattr(cls, "model_fields", {}) or {})
    for owner in cls.__mro__:
        found |= set(vars(owner)) | set(getattr(owner, "__annotations__", {}))
        try:
            source = inspect.getsource(owner)
        except (OSError, TypeError):
            continue
        for node in ast.walk(ast.parse(source.strip() if source.startswith(" ") else source)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                found.add(node.attr)  # fmt: skip
    return found


def evaluate(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for module, names in sorted(manifest["modules"].items()):
        module_ok = our_object(module)[0]
        for name, entry in sorted(names.items()):
            ok, obj = our_object(module, name) if module_ok else (False, None)
            row = {"module": module, "name": name, "kind": entry["kind"],
                   "origin": entry["origin"], "ours": ok, "members": None}  # fmt: skip
            members = entry.get("members")
            if members is not None:
                have = our_members(obj) if ok and inspect.isclass(obj) else set()
                row["members"] = (sum(m in have for m in members), len(members),
                                  [m for m in members if m not in have])  # fmt: skip
            rows.append(row)
    return rows


def render(manifest: dict[str, Any]) -> str:
    rows = evaluate(manifest)
    provided = sum(r["ours"] for r in rows)
    member_total = sum(r["members"][1] for r in rows if r["members"])
    member_have = sum(r["members"][0] for r in rows if r["members"])
    lines = [
        "# Atropos 0.4 compatibility report",
        "",
        "Generated by `python scripts/atropos_compat_report.py render` (CI runs `check`: a "
        "name that disappears from ours fails the build). Source: "
        f"{manifest['source']}; scope: `atroposlib.envs`, `atroposlib.envs.server_handling`, "
        "`atroposlib.utils`, `atroposlib.type_definitions`.",
        "",
        f"**Totals: {provided} of {len(rows)} public names provided at the same import path; "
        f"{member_have} of {member_total} public members of those classes.** The static census "
        "of Atropos's 139 environment files (`scripts/atropos_census.py`) finds no import or "
        "attribute they use that resolves on Atropos and fails on ours.",
        "",
        "Where Atropos's behaviour was a bug we keep our fix: the reward registry resolves "
        "`r1`-style file names to the intended class, `process` no longer "
        "retries an item forever or exits 0 with nothing written, a malformed group is skipped "
        "instead of crashing, and teacher servers are wired for every command.",
        "",
        "## Not provided, on purpose",
        "",
        "| module or name | why |",
        "|---|---|",
    ]
    lines += [f"| `{m}` | {why} |" for m, why in sorted(NOT_PROVIDED.items())]
    lines += ["", "## Every name", "", "| module | name | kind | ours | members (ours/theirs) |",
              "|---|---|---|---|---|"]  # fmt: skip
    for row in rows:
        mark = "yes" if row["ours"] else "**no**"
        members = ""
        if row["members"]:
            have, total, missing = row["members"]
            members = f"{have}/{total}" + (f"; missing: {', '.join(missing)}" if missing else "")
        origin = "" if row["origin"] == "0.4.0" else " (repository)"
        lines.append(f"| `{row['module']}`{origin} | `{row['name']}` | {row['kind']} | {mark} | "
                     f"{members} |")  # fmt: skip
    if RESULTS.exists():
        lines += ["", *table(json.loads(RESULTS.read_text()))]
    if HERMES_RESULTS.exists():
        on_vllm = HERMES_RESULTS_VLLM.exists() and json.loads(HERMES_RESULTS_VLLM.read_text())
        lines += ["", *hermes_section(json.loads(HERMES_RESULTS.read_text()), on_vllm or None)]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["refresh", "render", "check"])
    parser.add_argument("--wheel", type=Path, help="atroposlib-0.4.0 wheel (default: download)")
    parser.add_argument("--repo", type=Path, help="checkout of the archived repository")
    args = parser.parse_args(argv)
    if args.command == "refresh":
        refresh(args.wheel, args.repo)
    text = render(json.loads(MANIFEST.read_text()))
    if args.command == "check":
        if REPORT.read_text() != text:
            print(
                "docs/atropos-compat.md is out of date (or a name disappeared from ours): run "
                "python scripts/atropos_compat_report.py render and read the diff"
            )
            return 1
        return 0
    REPORT.write_text(text)
    print(text.split("\n")[6])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
