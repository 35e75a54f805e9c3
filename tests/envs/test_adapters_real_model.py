"""The adapters with the real small model on the embedded server, offline.

A verifiers single-turn env (two-function rubric), a verifiers multi-turn env (scripted user)
and an OpenEnv server written with openenv-core each run ``process`` (scores equal what their
own scorers give for the same completions) and ``serve`` against a real broker while the GRPO
trainer takes its steps. Token-exactness is checked with the catalogue's check
(``tests/environments/test_env_token_truth.py``).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from adapters_testlib import GUESS_SERVER, import_vf_env, write_vf_envs
from envs_testlib import REPO_ROOT, broker_process, child_env

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inference"))
from inference_helpers import RunningServer

pytestmark = [pytest.mark.slow, pytest.mark.model]

VERIFIERS_SCRIPT = REPO_ROOT / "environments" / "verifiers_env" / "env.py"
OPENENV_SCRIPT = REPO_ROOT / "environments" / "openenv_env" / "env.py"
sys.path.insert(0, str(GUESS_SERVER.parent))
from guess_server import MAX_GUESSES, step_reward  # noqa: E402


@pytest.fixture(scope="module")
def vf_envs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_vf_envs(tmp_path_factory.mktemp("vf_envs"))


def common_flags(server: RunningServer) -> list[str]:
    return [
        f"--openai.base_url={server.url}/v1", f"--openai.model_name={server.name}",
        "--openai.server_type=embedded", f"--env.tokenizer_name={server.model_path}",
        "--env.max_token_length=512",
    ]  # fmt: skip


def adapter_env(vf_envs: Path) -> dict[str, str]:
    env = child_env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}:{vf_envs}"
    return env


def run_process(script: Path, flags: list[str], tmp: Path, env: dict[str, str]) -> list[dict]:
    out = tmp / "groups.jsonl"
    args = [sys.executable, str(script), "process", "--env.total_steps=2", "--env.group_size=2",
            f"--env.data_path_to_save_groups={out}", *flags]  # fmt: skip
    done = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2
    for group in groups:
        assert len(group["tokens"]) == len(group["masks"]) == len(group["scores"]) == 2
        for tokens, masks, logprobs in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], strict=True
        ):
            assert len(tokens) == len(masks) == len(logprobs) and masks[0] == -100
            assert any(m != -100 for m in masks)
    return groups


def replies(group: dict, index: int) -> list[str]:
    return [m["content"] for m in group["messages"][index] if m["role"] == "assistant"]


def test_verifiers_single_turn_process_scores_with_its_rubric(
    smol: RunningServer, vf_envs: Path, tmp_path: Path
) -> None:
    flags = [*common_flags(smol), "--env.vf_env=vf_sum", "--env.max_completion_tokens=24"]
    groups = run_process(VERIFIERS_SCRIPT, flags, tmp_path, adapter_env(vf_envs))
    rubric = import_vf_env(vf_envs, "vf_sum")
    for group in groups:
        question = group["messages"][0][-2]["content"]
        answer = str(int(question.split()[2]) + 2)
        for index, extra in enumerate(group["extra"]):
            [reply] = [text.strip() for text in replies(group, index)]  # as trace.last_reply
            expected = {"correct_answer": rubric.correct(reply, answer),
                        "short_answer": rubric.brevity(reply)}  # fmt: skip
            assert extra["vf_rewards"] == pytest.approx(expected)
            weighted = expected["correct_answer"] + 0.5 * expected["short_answer"]
            assert group["scores"][index] == pytest.approx(weighted)


def test_verifiers_multi_turn_process_scores_every_turn(
    smol: RunningServer, vf_envs: Path, tmp_path: Path
) -> None:
    flags = [*common_flags(smol), "--env.vf_env=vf_say", "--env.max_completion_tokens=12"]
    groups = run_process(VERIFIERS_SCRIPT, flags, tmp_path, adapter_env(vf_envs))
    scorer = import_vf_env(vf_envs, "vf_say")
    for group in groups:
        for index, extra in enumerate(group["extra"]):
            users = [m["content"] for m in group["messages"][index] if m["role"] == "user"]
            numbers = [int(text.split()[-1].rstrip(".")) for text in users]
            assert len(replies(group, index)) == 2 and extra["vf_metrics"] == {"turns": 2.0}
            expected = scorer.said(replies(group, index), numbers)
            assert group["scores"][index] == pytest.approx(expected)


def test_openenv_process_scores_with_the_servers_rewards(
    smol: RunningServer, tmp_path: Path
) -> None:
    command = f"{sys.executable} {GUESS_SERVER} --port {{port}}"
    flags = [*common_flags(smol), f"--env.openenv_command={command}", "--env.seed=3",
             "--env.max_completion_tokens=8"]  # fmt: skip
    groups = run_process(OPENENV_SCRIPT, flags, tmp_path, child_env())
    for group in groups:
        for index, extra in enumerate(group["extra"]):
            secret = random.Random(extra["openenv_seed"]).randrange(10)
            said = replies(group, index)
            assert 1 <= extra["openenv_steps"] == len(said) <= MAX_GUESSES
            rewards = [step_reward(secret, reply)[0] for reply in said]
            assert group["scores"][index] == pytest.approx(sum(rewards))


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1.0)
    raise AssertionError(f"timed out waiting for {what}")


def test_serve_with_the_broker_and_the_trainer(
    smol: RunningServer, vf_envs: Path, tmp_path: Path
) -> None:
    broker = broker_process(tmp_path).start()
    logs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def spawn(name: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = tmp_path / f"{name}.log"
        proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=log.open("wb"),
                                stderr=subprocess.STDOUT)  # fmt: skip
        logs.append((proc, log))
        return proc

    steps = 4
    try:
        trainer = spawn("trainer", [
            sys.executable, "-m", "example_trainer.train", "--model", str(smol.model_path),
            "--broker-url", broker.url, "--batch-size", "4", "--max-token-len", "512",
            "--micro-batch-tokens", "512", "--num-steps", str(steps), "--weight-sync", "none",
            "--save-dir", str(tmp_path / "ckpt"), "--metrics-file", str(tmp_path / "metrics.jsonl"),
        ], {**child_env(), "OMP_NUM_THREADS": "1"})  # fmt: skip
        wait_for(lambda: httpx.get(f"{broker.url}/info").json().get("batch_size", -1) > 0, 180,
                 "the trainer to register")  # fmt: skip
        command = f"{sys.executable} {GUESS_SERVER} --port {{port}}"
        adapters = {
            "vf_sum": (VERIFIERS_SCRIPT, ["--env.vf_env=vf_sum", "--env.max_completion_tokens=16"]),
            "vf_say": (VERIFIERS_SCRIPT, ["--env.vf_env=vf_say", "--env.max_completion_tokens=8"]),
            "guess": (OPENENV_SCRIPT, [f"--env.openenv_command={command}",
                                       "--env.max_completion_tokens=6"]),
        }  # fmt: skip
        for name, (script, flags) in adapters.items():
            spawn(name, [sys.executable, str(script), "serve", *common_flags(smol),
                         f"--env.rollout_server_url={broker.url}", "--env.group_size=2",
                         "--env.use_wandb=false", "--env.ensure_scores_are_not_same=false",
                         f"--env.wandb_name={name}", f"--env.total_steps={steps}",
                         f"--env.data_path_to_save_groups={tmp_path / name}.jsonl", *flags],
                  adapter_env(vf_envs))  # fmt: skip
        assert trainer.wait(timeout=900) == 0, (tmp_path / "trainer.log").read_text()[-3000:]
    finally:
        for proc, _ in logs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=20)
        broker.stop()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "train/loss" in row] == list(range(1, steps + 1))
    for name in ("vf_sum", "vf_say", "guess"):
        sent = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        assert sent, f"{name} sent no group: " + (tmp_path / f"{name}.log").read_text()[-2000:]
        assert all(len(json.loads(line)["tokens"]) == 2 for line in sent)
