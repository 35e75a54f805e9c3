"""Every shell command the docs show is checked here, taken from the docs themselves.

Each command matches one rule below, which says how it is checked: **run** here, **run by**
another test that reads the same command from the doc, or, where this machine cannot run it
(a GPU, a SLURM cluster, a long benchmark), **parsed** by the program's own parser with the
files it names checked to exist. A command that matches no rule fails: a new command in a doc
needs a rule, so nothing documented goes unchecked.

Substitutions, the only ones: a placeholder host (``BROKER``, ``VLLM_HOST``) is 127.0.0.1; a
placeholder folder (``DIR``, ``FOLDER``) is a temporary one; the guide's ``example_env.py``
is the copy the tests keep; a hub model name stays as written, as parsing loads no model.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import re
import runpy
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docs.doc_commands import REPO, DocCommand, doc_commands, doc_files, fences

PLACEHOLDERS = {"BROKER": "127.0.0.1", "VLLM_HOST": "127.0.0.1"}
PLACEHOLDER_FOLDERS = ("DIR", "FOLDER")
INPUT_FLAGS = {"--config", "--env.data_path", "--env-config", "--trainer-config", "--env-script"}
"""Flags whose value is a file the command reads: it must exist (relative to the checkout)."""
INTERPRETERS = {"python", ".venv/bin/python"}
"""``python`` in the venv the README's install makes; ``.venv/bin/python`` of scripts/setup-venv."""


def substituted(argv: list[str], folder: Path) -> list[str]:
    out = []
    for word in argv:
        if word.startswith("~/"):
            word = str(Path(word).expanduser())  # as the shell does
        for name, value in PLACEHOLDERS.items():
            word = re.sub(rf"\b{name}\b", value, word)
        if word in PLACEHOLDER_FOLDERS:
            word = str(folder)
        if word == "example_env.py":  # the guide's file, saved where the tests keep it
            word = "tests/envs/example_env.py"
        out.append(word)
    return out


def inputs_exist(argv: list[str]) -> None:
    """Each input file exists, from the checkout (or, for an env's, from the env's folder)."""
    script = next((REPO / w for w in argv if w.endswith("env.py")), REPO)
    for flag, value in itertools.pairwise(argv):
        if flag in INPUT_FLAGS:
            path = Path(value).expanduser()
            found = (REPO / path).exists() or (script.parent / path).exists()
            assert found, f"{flag} {value}: no such file"


def program(argv: list[str]) -> list[str]:
    """The argv from the program on: a leading ``VAR=value`` and ``flock LOCK`` dropped, the
    interpreter checked to be one the install gives."""
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
        argv = argv[1:]
    if argv[:1] == ["flock"]:
        argv = argv[2:]
    if argv[0].endswith("python") or "/python" in argv[0]:
        assert argv[0] in INTERPRETERS, f"{argv[0]}: not an interpreter the install gives"
    return argv


@contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved


@contextmanager
def argv_parsed_only() -> Iterator[list[argparse.Namespace]]:
    """argparse parses, then the program stops (the program itself never runs)."""
    parsed: list[argparse.Namespace] = []
    original = argparse.ArgumentParser.parse_args
    original_known = argparse.ArgumentParser.parse_known_args
    inside_parse_args = False

    class Parsed(Exception):
        pass

    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        nonlocal inside_parse_args
        inside_parse_args = True
        try:
            parsed.append(original(self, *args, **kwargs))
        finally:
            inside_parse_args = False
        raise Parsed

    def parse_known_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        """A program that passes unknown flags on (``parse_known_args``) stops there too."""
        known = original_known(self, *args, **kwargs)
        if inside_parse_args:
            return known
        parsed.append(known[0])
        raise Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = parse_known_then_stop  # type: ignore[method-assign]
    try:
        yield parsed
    except Parsed:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        argparse.ArgumentParser.parse_known_args = original_known  # type: ignore[method-assign]


# ---------------------------------------------------------------------------------------
# How each kind of command is checked
# ---------------------------------------------------------------------------------------


def env_class(script: Path) -> type:
    from atroposlib.envs.base import BaseEnv

    spec = importlib.util.spec_from_file_location(f"doc_env_{script.parent.name}", script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = [value for value in vars(module).values() if isinstance(value, type)
             and issubclass(value, BaseEnv) and value.__module__ == module.__name__]  # fmt: skip
    assert len(found) == 1, f"{script}: {len(found)} environment classes"
    return found[0]


def parse_env(argv: list[str], folder: Path) -> None:
    from atroposlib.envs.cli import parse_settings

    script = REPO / argv[1]
    assert script.is_file(), f"{argv[1]}: no such script"
    settings = parse_settings(env_class(script), argv[2], argv[3:], environ={})
    assert settings.env is not None


def parse_trainer(argv: list[str], folder: Path) -> None:
    from example_trainer.config import load_config

    assert load_config(argv[1:]).model


def parse_broker(argv: list[str], folder: Path) -> None:
    from atroposlib.cli.run_api import parse_settings

    assert parse_settings(argv[1:]) is not None


def parse_inference(argv: list[str], folder: Path) -> None:
    from atroposlib.cli.inference import parse_settings

    (folder / "checkpoints").mkdir(exist_ok=True)
    assert parse_settings(argv[3:]).model


def parse_view_run(argv: list[str], folder: Path) -> None:
    from atroposlib.cli.view_run import parse_settings

    assert parse_settings(argv[1:]).input


def parse_local(argv: list[str], folder: Path) -> None:
    from atroposlib.cli.local import parse_settings

    assert parse_settings(argv[1:]).steps > 0


def parse_python_script(argv: list[str], folder: Path) -> None:
    """A benchmark or script: its own argparse parser takes the flags."""
    script = REPO / argv[1]
    assert script.is_file(), f"{argv[1]}: no such file"
    with argv_parsed_only() as parsed, _argv([str(script), *argv[2:]]):
        runpy.run_path(str(script), run_name="__main__")
    assert parsed, f"{argv[1]}: its parser never ran"


def parse_gpu_check(argv: list[str], folder: Path) -> None:
    with argv_parsed_only() as parsed, _argv(["gpu-check", *argv[1:]]):
        sys.path.insert(0, str(REPO / "scripts"))
        try:
            runpy.run_module("gpu_check", run_name="__main__")
        finally:
            sys.path.remove(str(REPO / "scripts"))
    assert parsed and parsed[0].command == argv[1]


def run_slurm_placement(argv: list[str], folder: Path) -> None:
    fake_bin = folder / "bin"
    fake_bin.mkdir()
    (fake_bin / "scontrol").write_text("#!/bin/sh\nprintf 'gpu001\\ngpu002\\n'\n")
    (fake_bin / "scontrol").chmod(0o755)
    environ = {"SLURM_JOB_NODELIST": "gpu[001-002]", "PYTHONPATH": str(REPO),
               "PATH": f"{fake_bin}:/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip(), "printed nothing"


def run_in_bash(argv: list[str], folder: Path) -> None:
    """An ``export`` (the ones above it in its block are in this process's environment by
    now): the variable ends up set."""
    name = argv[1].split("=", 1)[0]
    script = f'set -eu; {" ".join(argv)}; printf %s "${name}"'
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout, f"{name} is empty"
    if "openssl rand -hex 32" in " ".join(argv):
        assert re.fullmatch(r"[0-9a-f]{64}", done.stdout), done.stdout


def pip_install(argv: list[str], folder: Path) -> None:
    """The torch pin is the one scripts/setup-venv installs; every extra exists."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for word in argv[2:]:
        if word.startswith("torch=="):
            assert word in (REPO / "scripts" / "setup-venv").read_text(), word
        if m := re.fullmatch(r"\.?\[([\w,-]+)\]", word):
            for extra in m.group(1).split(","):
                assert extra in project["optional-dependencies"], f"no extra {extra!r}"
    atropos_control = argv[2] == "atroposlib==0.4.0"  # Atropos itself, docs/atropos-env-trials.md
    assert argv[2] == "-e" or argv[2].startswith("torch") or atropos_control


def sbatch(argv: list[str], folder: Path) -> None:
    """``--nodes`` (the script's own default: 1) many fake hosts, ``--export`` variables."""
    from tests.cluster.test_sbatch import finish_job, start_job

    options = argv[1 : argv.index("slurm/atropos.sbatch")]
    config = argv[-1].removeprefix("configs/")
    nodes, env = 1, {}
    for index, option in enumerate(options):
        if option.startswith("--nodes"):
            nodes = int(option.split("=", 1)[1] if "=" in option else options[index + 1])
        if option.startswith("--export="):
            env.update(dict(p.split("=", 1) for p in option[9:].split(",") if "=" in p))
    job = finish_job(folder, start_job(folder, config, [f"n{i}" for i in range(nodes)], **env))
    assert job.returncode == 0, job.output[-3000:]
    assert job.launched("trainer"), job.output[-3000:]


def run_by(test: str, needle: str) -> Callable[[list[str], Path], None]:
    """Run by another test: its file exists, has that test, and runs this command."""

    def check(argv: list[str], folder: Path) -> None:
        path, _, name = test.partition("::")
        source = (REPO / path).read_text()
        assert not name or f"def {name}(" in source, f"{test}: no such test"
        assert needle in source, f"{test} does not run {needle!r}"

    return check


@dataclass(frozen=True)
class Rule:
    pattern: str  # matched against the command's text from its start
    check: Callable[..., None]
    how: str


RULES = [
    Rule(r"scripts/test$", run_by(".ci/run::", "scripts/test --all"), "CI runs it (.ci/run)"),
    Rule(r"scripts/demo$", run_by(
        "tests/test_local_loop.py::test_short_local_run_trains_syncs_weights_and_cleans_up",
        'doc_command("README.md", "scripts/demo")'), "run (slow tier), 2 steps"),
    Rule(r"VLLM_SERVER_DEV_MODE=1 python -m vllm", run_by(
        "tests/docs/test_cluster_recipe_vllm_real.py::test_the_readme_cluster_recipe_runs_on_vllm",
        "doc_commands_in_block"), "run (vllm tier) on vLLM's CPU build"),
    Rule(r"scripts/gpu-check run --device cpu", run_by(
        "tests/tools/test_gpu_check.py::test_prepare_then_the_whole_check_on_cpu_passes",
        '"--device", "cpu"'),
        "run (slow tier)"),
    Rule(r"scripts/gpu-check ", parse_gpu_check, "parsed: needs PyPI (prepare) or CUDA (run)"),
    Rule(r"\.venv/bin/view-run ", parse_view_run, "parsed: it serves until stopped"),
    Rule(r"pip install ", pip_install, "extras and torch pin checked: installs from PyPI"),
    Rule(r"run-api ", parse_broker, "parsed: a server"),
    Rule(r"(python|\.venv/bin/python) environments/", parse_env, "parsed: needs inference"),
    Rule(r"python example_env.py ", parse_env, "parsed (the guide's file, as the tests ship it)"),
    Rule(r"atropos-grpo ", parse_trainer, "parsed: needs a broker and a GPU-sized model"),
    Rule(r"atropos-local ", parse_local, "parsed: a 10-minute learning run"),
    Rule(r"python -m atroposlib.inference ", parse_inference, "parsed: a server"),
    Rule(r"python -m atroposlib\.(cli\.slurm_plan|envs\.server_handling\.slurm) ",
         run_slurm_placement, "run, under a fake scontrol"),
    Rule(r"export \w+=", run_in_bash, "run"),
    Rule(r"sbatch ", sbatch, "run under a fake SLURM (tests/cluster/test_sbatch.py's)"),
    Rule(r"(\S+=\S+ )?(flock \S+ )?\S*python benchmarks/", parse_python_script,
         "parsed: benchmarks take minutes to an hour"),
]  # fmt: skip


def rule_for(command: DocCommand) -> Rule:
    matched = [rule for rule in RULES if re.match(rule.pattern, command.text)]
    assert matched, f"{command}: no rule says how this command is checked (add one here)"
    return matched[0]


COMMANDS = doc_commands()


def test_the_docs_show_commands_to_check() -> None:
    assert len(COMMANDS) > 30  # the extraction finds them


def test_every_code_block_names_its_language() -> None:
    untagged = [f"{f.page.relative_to(REPO)}:{f.line}" for page in doc_files()
                for f in fences(page) if not f.lang]  # fmt: skip
    assert not untagged, f"fenced blocks without a language (bash, text, yaml...): {untagged}"


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_documented_command(
    command: DocCommand, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rule = rule_for(command)
    monkeypatch.chdir(REPO)
    for name, value in command.exports:
        shell = subprocess.run(["bash", "-c", f"echo {value}"], capture_output=True, text=True)
        monkeypatch.setenv(name, shell.stdout.strip())
    argv = substituted(command.argv, tmp_path)
    inputs_exist(argv)
    rule.check(program(argv), tmp_path)
