"""``process`` and ``evaluate`` write what atroposlib 0.4.0 writes, on the same env file
(``atropos_style/output_compat_env.py``) and the same stub server: the JSONL byte for byte,
``wandb_log`` once per group with ``use_wandb`` on (as Atropos forces it; ``WANDB_MODE``
disabled: no network), ``metrics.json`` / ``samples.jsonl`` byte for byte, and every setting
of Atropos's ``evaluate_config.yaml`` with the same value. The 0.4.0 wheel is downloaded from
PyPI at test time (as for Atropos's own tests) and run from where it is unpacked."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from envs_testlib import REPO_ROOT, Process, child_env, fake_inference, tokenizer_path

from scripts.atropos_class_bases import unpack_wheel

pytestmark = pytest.mark.slow
ENV_FILE = Path(__file__).parent / "atropos_style" / "output_compat_env.py"
NOT_WRITTEN = {"api_key"}
"""Atropos wrote the server's API key into evaluate_config.yaml; we write null."""
SPELLED_DIFFERENTLY = {("tokenizer_name", "none"): None}
"""A server's tokenizer_name: Atropos's "none" ("no tokenizer of its own") is our null."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """One ``process`` and one ``evaluate`` run on each library: {"atropos": dir, "ours": dir}."""
    scratch = tmp_path_factory.mktemp("output_compat")
    wheel = unpack_wheel(scratch / "pypi")
    fake: Process = fake_inference(scratch).start()
    try:
        yield {who: run_both_commands(scratch / who, path, fake.url)
               for who, path in (("atropos", wheel), ("ours", REPO_ROOT))}  # fmt: skip
    finally:
        fake.stop()


def run_both_commands(folder: Path, library: Path, server_url: str) -> Path:
    folder.mkdir()
    shared = ["--openai.base_url", f"{server_url}/v1", "--openai.api_key", "x",
              "--env.tokenizer_name", tokenizer_path()]  # fmt: skip
    commands = {
        "process": ["--env.total_steps", "2", "--env.data_path_to_save_groups", "groups.jsonl"],
        "evaluate": ["--env.data_dir_to_save_evals", "evals"],
    }
    for command, flags in commands.items():
        env = child_env(PYTHONPATH=str(library), WANDB_MODE="disabled",
                        WANDB_LOG_RECORD=str(folder / f"wandb_log_{command}.jsonl"))  # fmt: skip
        done = subprocess.run([sys.executable, str(ENV_FILE), command, *shared, *flags],
                              cwd=folder, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, f"{library} {command}: {done.stderr[-3000:]}"
    return folder


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_process_jsonl_is_atropos_s_byte_for_byte(runs: dict[str, Path]) -> None:
    theirs, ours = (runs[who] / "groups.jsonl" for who in ("atropos", "ours"))
    assert ours.read_bytes() == theirs.read_bytes()
    rows = records(ours)
    assert len(rows) == 2 and rows[0]["advantages"] == [] and rows[0]["group_overrides"] == {}


def test_wandb_log_is_called_per_group_with_use_wandb_on(runs: dict[str, Path]) -> None:
    theirs, ours = (records(runs[who] / "wandb_log_process.jsonl") for who in ("atropos", "ours"))
    assert ours == theirs == [{"metrics": [], "use_wandb": True}] * 2


def test_evaluate_writes_the_same_metrics_samples_and_config(runs: dict[str, Path]) -> None:
    theirs, ours = runs["atropos"] / "evals", runs["ours"] / "evals"
    for name in ("metrics.json", "samples.jsonl"):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    their_config = yaml.safe_load((theirs / "evaluate_config.yaml").read_text())
    our_config = yaml.safe_load((ours / "evaluate_config.yaml").read_text())
    assert list(our_config) == list(their_config) == ["env", "openai", "slurm", "testing"]
    assert our_config["env"]["use_wandb"] is True
    pairs = [(their_config["env"], our_config["env"])]
    pairs += list(zip(their_config["openai"], our_config["openai"], strict=True))
    for theirs_section, ours_section in pairs:
        for key, value in theirs_section.items():
            if key in NOT_WRITTEN:
                assert ours_section[key] is None
            elif (key, value) in SPELLED_DIFFERENTLY:
                assert ours_section[key] == SPELLED_DIFFERENTLY[key, value]
            else:
                assert ours_section[key] == value, key
