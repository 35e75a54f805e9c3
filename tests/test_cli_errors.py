"""Every command line, run as a user runs it: a bad value names the flag and the reason on one
line and exits 2; ``--help`` shows at most one default per option."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atroposlib.utils.cli import describe_validation_error, one_default

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ENV_SCRIPT = str(REPO_ROOT / "environments" / "reasoning_gym" / "env.py")


def command(name: str) -> list[str]:
    """An installed console script, or an environment's ``env.py`` run by this Python."""
    if name.startswith("env "):
        return [sys.executable, ENV_SCRIPT, name.split()[1]]
    return [str(BIN / name)]


def run_all(cases: list[list[str]], env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(run, cases))


BAD_VALUES = [
    ("atropos-local", ["--steps", "abc"],
     "atropos-local: error: --steps: input should be a valid integer, got 'abc'"),
    ("atropos-local", ["--steps", "-5"],
     "atropos-local: error: --steps: input should be greater than 0, got '-5'"),
    ("run-api", ["--port", "abc"],
     "run-api: error: --port: input should be a valid integer, got 'abc'"),
    ("atropos-grpo", ["--num-steps", "abc"],
     "atropos-grpo: error: --num-steps: input should be a valid integer, got 'abc'"),
    ("atropos-sft-gen", ["out.jsonl", "--group-size", "abc"],
     "atropos-sft-gen: error: --group-size: input should be a valid integer, got 'abc'"),
    ("atropos-dpo-gen", ["out.jsonl", "--num-seqs-to-save", "-1"],
     "atropos-dpo-gen: error: --num-seqs-to-save: input should be greater than 0, got '-1'"),
    ("atropos-sft-gen", ["out.jsonl", "--group-size", "99999999999", "--save-messages"],
     "atropos-sft-gen: error: --group-size: input should be less than or equal to 2147483647, "
     "got '99999999999'"),
    ("atropos-dpo-gen", ["out.jsonl", "--group-size", "65536", "--tasks-per-step", "65536",
                         "--save-messages"],
     "atropos-dpo-gen: error: --group-size x --tasks-per-step = 4294967296 sequences per batch "
     "is more than the broker accepts (2147483647); lower one of them"),
    ("view-run", ["--limit", "abc"],
     "view-run: error: --limit: input should be a valid integer, got 'abc'"),
    ("view-run", ["--limit", "1e400"],
     "view-run: error: --limit: input should be a valid integer, got '1e400'"),
    ("jsonl2html", ["no-such-dump.jsonl"],
     "jsonl2html: error: no-such-dump.jsonl: no such file"),
    ("atropos-inference", ["--model", "m", "--port", "abc"],
     "atropos-inference: error: --port: input should be a valid integer, got 'abc'"),
    ("atropos-sandbox-check", ["--bogus"],
     "atropos-sandbox-check: error: unrecognized arguments: --bogus (see --help)"),
    ("env serve", ["--env.group_size", "abc"],
     "error: --env.group_size: input should be a valid integer, got 'abc'"),
    ("env process", ["--env.eval_size", "-3"],
     "error: --env.eval_size: input should be greater than or equal to 1, got '-3'"),
    ("env evaluate", ["--openai.timeout", "-1"],
     "error: --openai.timeout: input should be greater than 0, got '-1'"),
]  # fmt: skip


@pytest.mark.slow
def test_every_cli_names_the_flag_and_the_reason_and_exits_2(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    # no key at all (an empty ATROPOS_API_KEY is itself an error since keys are required to be real)
    env = {k: v for k, v in subprocess_env.items() if k != "ATROPOS_API_KEY"}
    results = run_all([[*command(name), *args] for name, args, _ in BAD_VALUES], env)
    for (name, args, expected), result in zip(BAD_VALUES, results, strict=True):
        assert result.returncode == 2, (name, args, result.stderr[-2000:])
        assert result.stderr.strip().splitlines() == [expected], (name, result.stderr[-2000:])


HELP = ["atropos-local", "run-api", "atropos-grpo", "atropos-inference", "atropos-sft-gen",
        "view-run", "jsonl2html", "env serve"]  # fmt: skip
_OPTION = re.compile(r"^  (-\S+|[a-z_]+)", re.MULTILINE)


@pytest.mark.slow
def test_help_shows_one_default_per_option(subprocess_env: dict[str, str]) -> None:
    results = run_all([[*command(name), "--help"] for name in HELP], subprocess_env)
    for name, result in zip(HELP, results, strict=True):
        assert result.returncode == 0, (name, result.stderr[-2000:])
        starts = [m.start() for m in _OPTION.finditer(result.stdout)]
        assert len(starts) > 1, (name, result.stdout)
        blocks = [result.stdout[a:b] for a, b in zip(starts, [*starts[1:], None], strict=True)]
        twice = [block.split()[0] for block in blocks if block.lower().count("(default") > 1]
        assert twice == [], (name, twice)


class Run(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: int = Field(gt=0)
    name: str
    ratio: float = 0.5


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"steps": "abc", "name": "a"}, "--steps: input should be a valid integer, got 'abc'"),
        ({"steps": 0, "name": "a"}, "--steps: input should be greater than 0, got 0"),
        ({"name": "a"}, "--steps: field required"),
        ({"steps": "x"}, "--steps: input should be a valid integer, got 'x' (+1 more)"),
        ({"steps": 1, "name": "a", "ratio": "half"},
         "--ratio: input should be a valid number, got 'half'"),
        ({"steps": 1, "name": "a", "max_ratio": 2},  # a YAML key, named as written there
         "max_ratio: extra inputs are not permitted, got 2"),
    ],
)  # fmt: skip
def test_validation_errors_read_flag_reason_value(values: dict, expected: str) -> None:
    with pytest.raises(ValidationError) as err:
        Run(**values)
    assert describe_validation_error(err.value) == expected


def test_one_default_keeps_the_described_default_only() -> None:
    assert one_default("Model (default: the test model). (default: null)") == (
        "Model (default: the test model)."
    )
    assert one_default("Steps. (default: 40)") == "Steps. (default: 40)"
    assert one_default("Token (default: $TOKEN) (default: null)") == "Token (default: $TOKEN)"
