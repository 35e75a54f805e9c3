"""The class hierarchy of atroposlib 0.4.0's public classes, as data for a CI test.

    python scripts/atropos_class_bases.py [--wheel W.whl]
        reads every public class of the wheel's ``envs``, ``utils`` and ``type_definitions``
        (downloaded with pip when --wheel is not given) and writes
        tests/envs/data/atropos_040_class_bases.json

Each entry names where a class is defined and its bases: an atroposlib base as
``module:Name`` (where it is defined), anything else as the dotted name it was imported by
(``abc.ABC``, ``pydantic.BaseModel``). ``tests/envs/test_atropos_class_bases.py`` compares
our classes' ``issubclass`` answers with it. Names only (API facts), no Atropos code; read
with ``ast``, nothing of the wheel is imported.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atropos_names import SourceTree

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "envs" / "data" / "atropos_040_class_bases.json"


def base_name(tree: SourceTree, module: str, base: ast.expr) -> str:
    """A base class expression of ``module`` as ``module:Name`` (atroposlib) or dotted."""
    if isinstance(base, ast.Name):
        found = tree.definition(module, base.id)
        if found is not None:
            return f"{found[0]}:{found[1]}"
        binding = tree.bindings(module).get(base.id)
        source = binding.source if binding is not None and binding.source else base.id
        return source.replace(":", ".")
    return ast.unparse(base)


def hierarchy(tree: SourceTree) -> dict[str, Any]:
    """``{"classes": {"module:Name": defined_at}, "bases": {defined_at: [base, ...]}}``."""
    classes: dict[str, str] = {}
    bases: dict[str, list[str]] = {}
    for module in tree.modules():
        for name in tree.public_names(module):
            found = tree.definition(module, name)
            node = tree.class_node(*found) if found else None
            if found is None or node is None:
                continue
            defined_at = f"{found[0]}:{found[1]}"
            classes[f"{module}:{name}"] = defined_at
            bases[defined_at] = [base_name(tree, found[0], b) for b in node.bases]
    return {"classes": dict(sorted(classes.items())), "bases": dict(sorted(bases.items()))}


def unpack_wheel(target: Path, wheel: Path | None = None) -> Path:
    """The atroposlib 0.4.0 wheel (downloaded with pip when not given) unpacked under
    ``target``; returns the folder holding its ``atroposlib`` package."""
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                        "--only-binary=:all:", "-d", str(target), "atroposlib==0.4.0"],
                       check=True)  # fmt: skip
        wheel = next(target.glob("atroposlib-0.4.0-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target / "wheel")
    return target / "wheel"


def read_wheel(wheel: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        return hierarchy(SourceTree(unpack_wheel(Path(tmp), wheel)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="the atroposlib 0.4.0 wheel (else pip)")
    args = parser.parse_args(argv)
    data = {"source": "atroposlib 0.4.0 wheel (PyPI), read by scripts/atropos_class_bases.py",
            **read_wheel(args.wheel)}  # fmt: skip
    DATA.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{len(data['classes'])} public class names, {len(data['bases'])} classes -> {DATA}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
