"""``prepare``: the wheels our runtime needs beyond the node's packages, and the tokenizer.

The runtime is atroposlib's core requirements (what the broker, the embedded server, the envs
and the trainer import) plus safetensors; the node already has torch, transformers, peft,
accelerate, numpy, httpx, rich, pyyaml, msgpack, psutil, prometheus-client and uvloop, and
whatever they need. Walking the requirements from our roots, never into a node package, gives
the list; each is downloaded at the version installed in this venv (the versions the test suite
runs), as a wheel for the node's interpreter (CPython 3.12, manylinux x86_64).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

NODE_PACKAGES = frozenset(
    canonicalize_name(name)
    for name in (
        "torch", "transformers", "peft", "accelerate", "numpy", "httpx", "rich", "pyyaml",
        "msgpack", "psutil", "prometheus-client", "uvloop",
    )
)  # fmt: skip
"""What the node has installed (issue 39); their own requirements come with them."""

EXTRA_ROOTS = ("safetensors",)
"""Imported by the embedded server and the trainer (the inference/trainer extras' only needs
beyond the node's packages)."""

PLATFORMS = (
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
    "manylinux2014_x86_64", "manylinux1_x86_64",
)  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
LIMIT_MIB = 60


def target_environment(python_version: str) -> dict[str, str]:
    env = default_environment()
    env.update(
        python_version=python_version,
        python_full_version=f"{python_version}.0",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


def runtime_requirements() -> list[Requirement]:
    """atroposlib's own requirements without extras, plus :data:`EXTRA_ROOTS`."""
    declared = metadata.requires("atroposlib") or []
    roots = [Requirement(r) for r in declared]
    roots = [r for r in roots if r.marker is None or "extra" not in str(r.marker)]
    return roots + [Requirement(name) for name in EXTRA_ROOTS]


def needed_distributions(python_version: str) -> dict[str, str]:
    """{distribution: installed version} for every package to ship, walked from the roots."""
    env = target_environment(python_version)

    def applies(requirement: Requirement, extras: frozenset[str]) -> bool:
        marker = requirement.marker
        return marker is None or any(marker.evaluate({**env, "extra": e}) for e in ("", *extras))

    needed: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [r for r in runtime_requirements() if applies(r, frozenset())]
    while todo:
        requirement = todo.pop()
        name, extras = canonicalize_name(requirement.name), frozenset(requirement.extras)
        if name in NODE_PACKAGES or (name, extras) in seen:
            continue
        seen.add((name, extras))
        dist = metadata.distribution(requirement.name)
        needed[name] = dist.version
        todo += [c for c in map(Requirement, dist.requires or []) if applies(c, extras)]
    return dict(sorted(needed.items()))


def download(pins: dict[str, str], dest: Path, python_version: str) -> None:
    abi = "cp" + python_version.replace(".", "")
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
         "--abi", abi, "--abi", "abi3", "--abi", "none", *platforms, "--platform", "any",
         "--dest", str(dest), *(f"{name}=={version}" for name, version in pins.items())],
        check=True,
    )  # fmt: skip


def copy_tokenizer(dest: Path) -> None:
    """The offline test model's tokenizer: the node builds models around it (no weights)."""
    from atroposlib.utils.test_model import ensure_test_model

    source = ensure_test_model()
    dest.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, dest / name)


def commit_of(root: Path) -> str:
    head = ["git", "rev-parse", "HEAD"]
    return subprocess.run(head, cwd=root, capture_output=True, text=True).stdout.strip()


def folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def tree_mib(root: Path) -> float:
    """What travels to the node: tracked and untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    files = (root / name for name in listed if name)
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20


def prepare(dest: Path, root: Path, python_version: str) -> int:
    pins = needed_distributions(python_version)
    wheels = dest / "wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    wheels.mkdir(parents=True)
    download(pins, wheels, python_version)
    copy_tokenizer(dest / "tokenizer")
    got = {canonicalize_name(w.name.split("-")[0]) for w in wheels.glob("*.whl")}
    missing = sorted(set(pins) - got)
    manifest = {"python_version": python_version, "commit": commit_of(root), "wheels": pins,
                "node_packages": sorted(NODE_PACKAGES)}  # fmt: skip
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    prepared, tree = folder_mib(dest), tree_mib(root)
    listed = ", ".join(f"{name}=={version}" for name, version in pins.items())
    print(f"{len(pins)} wheels for CPython {python_version}: {listed}")
    print(f"prepared {dest}: {prepared:.1f} MiB (wheels {folder_mib(wheels):.1f}, tokenizer "
          f"{folder_mib(dest / 'tokenizer'):.1f}); working tree {tree:.1f} MiB; together "
          f"{prepared + tree:.1f} MiB (limit {LIMIT_MIB})")  # fmt: skip
    if missing:
        print(f"error: no wheel downloaded for {', '.join(missing)}", file=sys.stderr)
        return 1
    if prepared + tree > LIMIT_MIB:
        print(
            f"error: {prepared + tree:.1f} MiB is over the {LIMIT_MIB} MiB limit", file=sys.stderr
        )
        return 1
    return 0
