"""docs/writing-an-environment.md, "Train your own environment on this machine": the env and
config it shows are the shipped files, and its atropos-local command runs as written (2 steps
and 4 held-out problems in place of its 20 and 100)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Train your own environment on this machine\n"
ADDITION = REPO_ROOT / "environments" / "addition"


def section() -> str:
    page = (REPO_ROOT / "docs" / "writing-an-environment.md").read_text()
    start = page.index(SECTION)
    end = page.index("\n## ", start + len(SECTION))
    return page[start:end]


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(), re.DOTALL)


def documented_command() -> list[str]:
    (command,) = blocks("bash")
    return shlex.split(command.replace("\\\n", " "))


def shrunk(argv: list[str], **values: str) -> list[str]:
    """``argv`` with the value after each ``--flag`` named in ``values`` replaced."""
    out = list(argv)
    for flag, value in values.items():
        option = "--" + flag.replace("_", "-")
        out[out.index(option) + 1] = value
    return out


def test_the_guide_shows_the_shipped_env_and_config() -> None:
    assert blocks("python") == [(ADDITION / "env.py").read_text()]
    assert blocks("yaml") == [(ADDITION / "config.yaml").read_text()]
    argv = documented_command()
    assert argv[0] == "atropos-local"
    assert argv[argv.index("--env-script") + 1] == "environments/addition/env.py"
    assert argv[argv.index("--env-config") + 1] == "environments/addition/config.yaml"


@pytest.mark.slow
def test_the_documented_command_trains_and_grades_held_out_before_and_after(
    tmp_path: Path, test_model_path: Path, subprocess_env: dict[str, str]
) -> None:
    argv = shrunk(documented_command(), steps="2", eval_size="4")
    result = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.local", *argv[1:]],
        cwd=tmp_path, env=subprocess_env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").glob("local-*")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["final_weight_version"] >= 2
    steps = [
        row["step"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "train/loss" in (row := json.loads(line))
    ]
    assert steps == [1, 2]
    # the env's own token sampler, on its config's defaults (max_completion_tokens, temperature)
    groups = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert groups and all(g["inference_logprobs"] for g in groups)
    assert {(g["generation_params"]["max_tokens"], g["generation_params"]["temperature"])
            for g in groups} == {(24, 0.7)}  # fmt: skip
    # held out, before and after: the env's graded samples and the summary's figures agree
    held_out = summary["held_out_eval"]
    assert held_out["problems"] == 4
    assert held_out["overlap_with_training_pool"] == 0
    assert held_out["overlap_with_trained_prompts"] == 0
    assert held_out["training_pool_problems"] > 1000
    for label, when in (("before", "before"), ("after", "after")):
        rows = [json.loads(line) for line in (run_dir / f"eval_{label}" / "samples.jsonl").open()]
        assert len({r["problem"] for r in rows}) == 4
        assert held_out["strict"][when] == sum(r["strict"] for r in rows) / 4
        assert held_out["lenient"][when] == sum(r["lenient"] for r in rows) / 4
    assert [s["step"] for s in summary["held_out_snapshots"]] == [0, 2]
    assert "strict (format + right)" in result.stdout and "wrong->right" in result.stdout
