"""scripts/setup-venv installs torch's CPU build: PyTorch's CPU index first, then the default
index with a warning; the venv the tests run in has no CUDA build."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "setup-venv"


def torch_installs(index: str | None = None) -> list[list[str]]:
    """The pip command lines the script would run for torch, with ``ATROPOS_TORCH_INDEX``."""
    env = {k: v for k, v in os.environ.items() if k != "ATROPOS_TORCH_INDEX"}
    if index is not None:
        env["ATROPOS_TORCH_INDEX"] = index
    done = subprocess.run(
        [str(SCRIPT), "--print-torch-install"], capture_output=True, text=True, check=True,
        env=env, timeout=30,
    )  # fmt: skip
    return [line.split() for line in done.stdout.splitlines()]


def test_the_cpu_index_comes_first_and_the_default_index_second() -> None:
    cpu, default = torch_installs()
    assert cpu[cpu.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert cpu[-1] == default[-1] == "torch==2.13.0"
    assert "--index-url" not in default and "--extra-index-url" not in default
    assert cpu[:3] == default[:3] and cpu[1:5] == ["-m", "pip", "install", "-q"]


@pytest.mark.parametrize(
    ("index", "expected"),
    [("https://mirror.example/whl/cpu", 2), ("default", 1)],
)
def test_the_cpu_index_can_be_replaced_or_skipped(index: str, expected: int) -> None:
    installs = torch_installs(index)
    assert len(installs) == expected
    if expected == 2:
        assert installs[0][installs[0].index("--index-url") + 1] == index


def test_an_unreachable_cpu_index_falls_back_with_a_warning(tmp_path: Path) -> None:
    """The script's torch step against a stand-in pip: the CPU index fails, the default works."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    python = venv / "bin" / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {calls}\n'
        'case "$*" in\n'
        '  *"import torch"*) exit 1 ;;\n'  # torch is not installed yet
        "  *--index-url*) exit 1 ;;\n"  # the CPU index cannot be reached
        "esac\n"
        "exit 0\n"
    )
    python.chmod(0o755)
    done = subprocess.run(
        [str(SCRIPT)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "ATROPOS_VENV": str(venv), "ATROPOS_TORCH_INDEX": "http://127.0.0.1:9/cpu"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "about 190 MB" in done.stderr
    assert "warning: http://127.0.0.1:9/cpu could not be used" in done.stderr
    assert "3.5 GB" in done.stderr
    pip = [line for line in calls.read_text().splitlines() if line.startswith("-m pip install")]
    assert pip[1].endswith("--index-url http://127.0.0.1:9/cpu torch==2.13.0")
    assert pip[2] == "-m pip install -q torch==2.13.0"
    locked, project = pip[3].split(), pip[4]
    assert locked[:6] == ["-m", "pip", "install", "-q", "--no-deps", "-r"]  # the lock, no resolving
    assert project == "-m pip install -q --no-deps -e ."
    assert (venv / ".atroposlib-installed").is_file()


@pytest.mark.skipif(sys.platform != "linux", reason="the CPU/CUDA builds differ on Linux")
def test_this_venv_has_torch_without_cuda() -> None:
    """What CI installs from scratch: the CPU build, no NVIDIA libraries beside it."""
    assert torch.version.cuda is None
    assert torch.__version__.split("+")[0] == "2.13.0"
    nvidia = [d.metadata["Name"] for d in metadata.distributions()
              if (d.metadata["Name"] or "").lower().startswith("nvidia")]  # fmt: skip
    assert nvidia == []
