"""The README's cluster recipe, run as written on vLLM's CPU build.

The commands come from the README's block itself. Swapped, and only these: the hub model for
the offline test model; ``python -m vllm...`` runs in vLLM's CPU venv (``--dtype float32``, the
CPU's device; no torch.compile, ``NO_COMPILE``: the recipe's wiring is under test, not vLLM's
kernels); the fixed ports for free local ones; the env reads the GSM8K fixture file
rather than the hub dataset, with groups of 4 and 48-token answers, keeping groups whose scores are
all equal (the small model rarely solves a problem, so dropping them made the run wait 3-7
minutes for four groups with a signal: the wiring, not the drop, is under test here); the
trainer runs 2 steps of 8 sequences instead of 200 of 64, saving under this test's folder.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from atroposlib.utils.health import wait_healthy
from tests.docs.doc_commands import REPO, DocCommand, doc_commands_in_block
from tests.fakes import free_port
from tests.vllm_testlib import (
    NO_COMPILE,
    model_path,
    stop_process_group,
    vllm_environment,
    vllm_python,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

HUB_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
SMALLER = {"--batch-size": "8", "--num-steps": "2"}


def adapted(command: DocCommand, ports: dict[str, str], save_dir: Path) -> list[str]:
    text = command.text.replace(HUB_MODEL, str(model_path()))
    for fixed, free in ports.items():
        text = text.replace(f":{fixed}", f":{free}").replace(f"--port {fixed}", f"--port {free}")
    text = text.replace("BROKER", "127.0.0.1").replace("VLLM_HOST", "127.0.0.1")
    argv = shlex.split(text)
    for flag, value in SMALLER.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
    if "--save-dir" in argv:
        argv[argv.index("--save-dir") + 1] = str(save_dir)
    return argv


def stop_all(procs: list[subprocess.Popen[bytes]], vllm: subprocess.Popen[bytes] | None) -> None:
    """Each process; vLLM with its engine and workers (its own process group)."""
    for proc in reversed(procs):
        if proc is vllm:
            stop_process_group(proc)
        else:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.timeout(2400)
def test_the_readme_cluster_recipe_runs_on_vllm(tmp_path: Path) -> None:
    block = doc_commands_in_block("README.md", "run-api --host 0.0.0.0")
    exports = [c for c in block if c.text.startswith("export ")]
    broker, vllm, env, trainer = (c for c in block if not c.text.startswith("export "))
    shell = "; ".join(c.text for c in exports) + "; env -0"
    listed = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True)
    run_env = dict(line.split("=", 1) for line in listed.stdout.split("\0") if "=" in line)
    key = run_env["ATROPOS_API_KEY"]
    assert len(key) == 64 and run_env["VLLM_API_KEY"] == run_env["ATROPOS_OPENAI__API_KEY"] == key
    ports = {"8000": str(free_port()), "9000": str(free_port())}
    save_dir = tmp_path / "checkpoints"
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    child = {**run_env, **offline, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline"}
    broker_url, vllm_url = f"http://127.0.0.1:{ports['8000']}", f"http://127.0.0.1:{ports['9000']}"

    vllm_argv = adapted(vllm, ports, save_dir)
    assert vllm_argv[:3] == ["VLLM_SERVER_DEV_MODE=1", "python", "-m"]
    vllm_env = vllm_environment({**run_env, "VLLM_SERVER_DEV_MODE": "1"})
    vllm_cmd = [str(vllm_python()), *vllm_argv[2:], "--dtype", "float32", "--max-model-len", "1024",
                *NO_COMPILE]  # fmt: skip
    broker_argv = adapted(broker, ports, save_dir)
    broker_cmd = [sys.executable, "-m", "atroposlib.cli.run_api", *broker_argv[1:]]
    env_cmd = [sys.executable, *adapted(env, ports, save_dir)[1:], "--env.data_path",
               "environments/gsm8k/fixture.jsonl", "--env.group_size", "4",
               "--env.max_completion_tokens", "48", "--env.max_token_length", "512",
               "--env.use_wandb", "false", "--env.ensure_scores_are_not_same", "false"]  # fmt: skip
    trainer_cmd = [sys.executable, "-m", "example_trainer.train",
                   *adapted(trainer, ports, save_dir)[1:], "--max-token-len", "512"]  # fmt: skip
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("broker", "vllm", "env")}
    procs: list[subprocess.Popen[bytes]] = []
    vllm_proc: subprocess.Popen[bytes] | None = None
    try:
        procs.append(subprocess.Popen(broker_cmd, cwd=tmp_path, env=child,
                                      stdout=logs["broker"], stderr=subprocess.STDOUT))  # fmt: skip
        vllm_proc = subprocess.Popen(vllm_cmd, cwd=tmp_path, env=vllm_env, start_new_session=True,
                                     stdout=logs["vllm"], stderr=subprocess.STDOUT)  # fmt: skip
        procs.append(vllm_proc)
        bearer = {"Authorization": f"Bearer {key}"}
        wait_healthy(f"{broker_url}/health", timeout_s=120, process=procs[0], headers=bearer)
        wait_healthy(f"{vllm_url}/health", timeout_s=900, process=vllm_proc, headers=bearer)
        # the middleware holds the key: a push without it is refused, and changes nothing
        refused = httpx.post(f"{vllm_url}/pause", params={"mode": "keep"}, timeout=30)
        assert refused.status_code == 401
        procs.append(subprocess.Popen(env_cmd, cwd=REPO, env=child,
                                      stdout=logs["env"], stderr=subprocess.STDOUT))  # fmt: skip
        done = subprocess.run(trainer_cmd, cwd=REPO, env=child, capture_output=True, text=True,
                              timeout=1800)  # fmt: skip
        served = httpx.get(f"{vllm_url}/weight_info", timeout=30,
                           headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    finally:
        stop_all(procs, vllm_proc)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 2 loss" in done.stderr, done.stderr[-3000:]
    assert (save_dir / "step-2" / "config.json").is_file()
    assert str(served.json()["weight_version"]) == "2"  # pushed in flight, step by step
