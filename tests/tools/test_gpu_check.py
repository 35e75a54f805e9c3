"""scripts/gpu-check: what ``prepare`` ships, how ``run`` treats a failing step, and the whole
check on CPU (``--device cpu``, the tiny model), as CI runs it so it cannot rot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "scripts"))

from gpu_check import prepare, report, runner  # noqa: E402


def test_prepare_ships_our_runtime_beyond_the_nodes_packages_at_our_versions() -> None:
    from importlib import metadata

    pins = prepare.needed_distributions("3.12")
    for ours in ("fastapi", "starlette", "pydantic", "pydantic-core", "pydantic-settings",
                 "uvicorn", "orjson", "openai", "safetensors", "websockets"):  # fmt: skip
        assert pins[ours] == metadata.version(ours), ours
    assert not set(pins) & prepare.NODE_PACKAGES
    assert "httpcore" not in pins, "httpx's own requirement comes with the node's httpx"
    assert "matplotlib" not in pins and "gradio" not in pins, "extras are not the runtime"


def test_a_step_that_crashes_or_runs_out_of_time_is_recorded_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    prepared = tmp_path / "prepared"
    (prepared / "tokenizer").mkdir(parents=True)
    log = tmp_path / "gpu-check.log"
    env = {"PYTHONPATH": f"{REPO_ROOT / 'scripts'}:{REPO_ROOT}", "PATH": "/usr/bin:/bin"}
    crashed = runner.run_step(runner.Step("no_such_step", "", 10), "cpu", tmp_path, prepared,
                              env, 60, log, None)  # fmt: skip
    assert crashed["status"] == "crashed"
    assert "invalid choice" in crashed["why"]
    timed_out = runner.run_step(runner.Step("trainer_modes", "", 10), "cpu", tmp_path, prepared,
                                env, 0.5, log, None)  # fmt: skip
    assert timed_out["status"] == "timed out"
    assert "===== no_such_step" in log.read_text() and "===== trainer_modes" in log.read_text()
    line = report.row("no_such_step", "what it does", crashed)
    assert "crashed" in line and "invalid choice" in line


def test_run_refuses_without_prepare_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(REPO_ROOT / "scripts/gpu-check"), "run", "--device", "cpu", "--out",
         str(tmp_path / "out"), "--prepared", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().startswith("gpu-check: error:")
    assert "is not prepared" in done.stderr


@pytest.mark.slow
@pytest.mark.long(
    "each of the check's eight steps once, each its own process, after the prepare's wheel "
    "install; a step split off would repeat both (415 s in CI on 2026-12-02 with three "
    "workers, 226 s with two on 2026-12-03, 140-153 s on a quiet machine)"
)
def test_prepare_then_the_whole_check_on_cpu_passes(tmp_path: Path) -> None:
    """What CI runs: the wheels for the node downloaded (and installed for CPython 3.12 into a
    private folder), then every step on CPU with the tiny model."""
    prepared = tmp_path / "prepared"
    done = subprocess.run([str(REPO_ROOT / "scripts/gpu-check"), "prepare", "--dest",
                           str(prepared)], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "(limit 60)" in done.stdout
    assert (prepared / "tokenizer" / "tokenizer.json").is_file()
    out = tmp_path / "out"
    done = subprocess.run(
        [str(REPO_ROOT / "scripts/gpu-check"), "run", "--device", "cpu", "--out", str(out),
         "--prepared", str(prepared)],
        capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    body = json.loads((out / "gpu-check.json").read_text())
    assert done.returncode == 0, done.stdout[-3000:]
    assert body["install"]["ok"], body["install"]
    assert [s.name for s in runner.PLAN] == list(body["steps"])
    assert {s["status"] for s in body["steps"].values()} == {"passed"}
    steps = body["steps"]
    assert steps["server_logprobs"]["figures"]["fp32/max_abs_delta"] <= 1e-3
    assert steps["loop"]["figures"]["final_weight_version"] == 3
    assert steps["trainer_modes"]["figures"]["packed/tokens_per_s"] > 0
    assert "passed in" in done.stdout.splitlines()[-1]
