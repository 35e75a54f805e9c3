"""Every flag this repository's programs accept, read from their own parsers.

Each program runs until it asks argparse to parse (pydantic-settings builds an argparse parser
too); there the parser's option strings, its sub-commands' included, are taken and the program
stops. A flag written in prose or in an error message is right when one of these sets holds it
or when it belongs to another project's program (``EXTERNAL_FLAGS``, each with its owner).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import runpy
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from tests.docs.doc_commands import REPO

EXTERNAL_FLAGS = {
    "vLLM's `vllm serve`": {
        "--logprobs-mode", "--middleware", "--tool-call-parser", "--enable-auto-tool-choice",
        "--enable-lora", "--max-lora-rank", "--max-loras", "--weight-transfer-config",
        "--reasoning-parser", "--dtype", "--max-model-len", "--gpu-memory-utilization",
        "--enforce-eager", "--served-model-name", "--tensor-parallel-size", "--api-key",
        "--enable-prefix-caching", "--max-num-seqs", "--allowed-local-media-path",
        "--max-num-batched-tokens", "--enable-scale-out",
    },
    "SGLang's `launch_server`": {
        "--skip-server-warmup", "--tokenizer-worker-num", "--mem-fraction-static", "--tp-size",
    },
    "SLURM's srun/sbatch/scancel": {
        "--kill-on-bad-exit", "--overlap", "--export", "--wait", "--nodes", "--gres", "--signal",
    },
    "PyTorch's torchrun": {"--nproc-per-node", "--nproc_per_node", "--nnodes"},
    "pip": {"--index-url", "--extra-index-url", "--no-deps", "--upgrade", "--no-index", "--target"},
    "pytest": {"--timeout", "--durations", "--lf"},
    "Docker, unshare, bubblewrap": {
        "--network", "--unshare-all", "--die-with-parent", "--rm", "--map-root-user",
    },
    "hermes-agent's environments (scripts/hermes_agent_envs.py --env-arg)": {
        "--env.agent_temperature",
    },
}  # fmt: skip
"""Flags of other projects' programs that our docs and messages name, by owner."""


class _Stop(Exception):
    pass


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    flags = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _option_strings(sub)
    return flags


@contextlib.contextmanager
def _first_parser_taken() -> Iterator[list[set[str]]]:
    """argparse's parse stops the program; the parser's flags are kept."""
    taken: list[set[str]] = []
    original = argparse.ArgumentParser.parse_known_args

    def take(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        taken.append(_option_strings(self))
        raise _Stop

    argparse.ArgumentParser.parse_known_args = take  # type: ignore[method-assign]
    saved_argv = sys.argv
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield taken
    except _Stop:
        pass
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
        sys.argv = saved_argv


def flags_of(run: Callable[[], object], name: str) -> set[str]:
    with _first_parser_taken() as taken:
        run()
    assert taken, f"{name}: never reached its parser"
    return taken[0]


def _main(module: str, attribute: str, *args: object) -> Callable[[], object]:
    return lambda: getattr(importlib.import_module(module), attribute)(*args)


def _script(path: Path) -> Callable[[], object]:
    def run() -> object:
        sys.argv = [str(path)]
        return runpy.run_path(str(path), run_name="__main__")

    return run


def _module(name: str) -> Callable[[], object]:
    def run() -> object:
        sys.argv = [name]
        return runpy.run_module(name, run_name="__main__", alter_sys=True)

    return run


def _env(script: Path, command: str) -> Callable[[], object]:
    def run() -> object:
        from atroposlib.envs.cli import parse_settings
        from tests.docs.test_doc_commands import env_class

        return parse_settings(env_class(script), command, [], environ={})

    return run


def _eval_runner() -> object:
    from atroposlib.envs.eval import EvalRunnerSettings
    from atroposlib.utils.cli import parse_command_line

    return parse_command_line(EvalRunnerSettings, [], "eval")


def _shell_script_flags(path: Path) -> set[str]:
    """A bash script's flags: the ``--name)`` patterns of its ``case`` statements."""
    return set(re.findall(r"^\s*(--[\w-]+)(?:\|[^)]*)?\)", path.read_text(), re.M))


def programs() -> dict[str, Callable[[], object]]:
    """Each program of the repository by the name a user types, runnable up to its parse."""
    found: dict[str, Callable[[], object]] = {
        "run-api": _main("atroposlib.cli.run_api", "parse_settings", []),
        "atropos-inference": _main("atroposlib.cli.inference", "parse_settings", []),
        "atropos-local": _main("atroposlib.cli.local", "parse_settings", []),
        "atropos-grpo": _main("example_trainer.config", "load_config", []),
        "view-run": _main("atroposlib.cli.view_run", "parse_settings", []),
        "atropos-sft-gen": _main("atroposlib.cli.sft", "main", []),
        "atropos-dpo-gen": _main("atroposlib.cli.dpo", "main", []),
        "jsonl2html": _main("atroposlib.cli.jsonl2html", "main", []),
        "atropos-sandbox-check": _main("atroposlib.cli.sandbox_check", "main", []),
        "python -m atroposlib.cli.slurm_plan": _main("atroposlib.cli.slurm_plan", "main", []),
        "the agent proxy": _module("atroposlib.proxy"),
        "example_trainer/vllm_api_server.py": _script(REPO / "example_trainer/vllm_api_server.py"),
        "an EvalBase's runner": _eval_runner,
    }
    teacher_env = REPO / "tests/envs/atropos_style/teacher_distill_env.py"  # --teacher.* flags
    for script in [*sorted((REPO / "environments").glob("*/env.py")), teacher_env]:
        for command in ("serve", "process", "evaluate"):
            found[f"{script.relative_to(REPO)} {command}"] = _env(script, command)
    for folder in ("benchmarks", "scripts"):
        for path in sorted((REPO / folder).glob("*.py")):
            if "argparse" in path.read_text() and "__main__" in path.read_text():
                found[str(path.relative_to(REPO))] = _script(path)
    return found


@cache
def accepted_flags() -> dict[str, str]:
    """Flag -> the first program (or other project) that accepts it."""
    owner: dict[str, str] = {}
    sys.path.insert(0, str(REPO / "scripts"))  # gpu-check's package
    try:
        found = programs()
        found["scripts/gpu-check"] = _module("gpu_check")
        for name, run in found.items():
            for flag in flags_of(run, name):
                owner.setdefault(flag, name)
        for script in (
            "test",
            "demo",
            "setup-venv",
            "setup-vllm-cpu",
            "build-test-model",
            "lock-deps",
        ):
            for flag in _shell_script_flags(REPO / "scripts" / script):
                owner.setdefault(flag, f"scripts/{script}")
    finally:
        sys.path.remove(str(REPO / "scripts"))
    for external, flags in EXTERNAL_FLAGS.items():
        for flag in flags:
            owner.setdefault(flag, external)
    return owner
