"""The real small model behind the embedded inference server: a math-style and a code env run
``process`` end to end, offline."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from envcat_testlib import ENVIRONMENTS, child_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inference"))
from inference_helpers import RunningServer, start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.model]


@pytest.fixture(scope="module")
def smol(
    test_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    log = tmp_path_factory.mktemp("smol") / "server.log"
    server = start_server(test_model_path, child_env(), log, "--threads", "1")
    yield server
    stop_server(server)


def run_process(name: str, server: RunningServer, tmp: Path, *flags: str) -> list[dict]:
    out = tmp / f"{name}.jsonl"
    args = [
        sys.executable, str(ENVIRONMENTS / name / "env.py"), "process",
        f"--openai.base_url={server.url}/v1", f"--openai.model_name={server.name}",
        f"--env.tokenizer_name={server.model_path}", "--env.total_steps=1",
        "--env.group_size=2", f"--env.data_path_to_save_groups={out}", *flags,
    ]  # fmt: skip
    done = subprocess.run(args, cwd=tmp, env=child_env(), capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def check_shape(group: dict) -> None:
    assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == 2
    for tokens, masks, chat in zip(group["tokens"], group["masks"], group["messages"], strict=True):
        assert len(tokens) == len(masks)
        assert any(m != -100 for m in masks) and masks[0] == -100
        assert chat[-1]["role"] == "assistant" and chat[-1]["content"].strip()


def test_letter_counting_with_the_real_model(smol: RunningServer, tmp_path: Path) -> None:
    (group,) = run_process("letter_counting", smol, tmp_path, "--env.max_completion_tokens=16")
    check_shape(group)
    assert all(score in (0.0, 0.2, 1.0, 1.2) for score in group["scores"])


def test_code_execution_with_the_real_model(smol: RunningServer, tmp_path: Path) -> None:
    (group,) = run_process("code_execution", smol, tmp_path, "--env.max_completion_tokens=48")
    check_shape(group)
    assert all(score in (-1.0, -0.5, 0.5, 1.0) for score in group["scores"])
    assert all(e["sandbox_status"] for e in group["extra"])
