"""slurm/atropos.sbatch under a fake SLURM: which commands it launches where, and how it stops.

``scontrol``, ``srun``, ``scancel`` and ``curl`` on PATH are small shell fakes: srun records
its arguments and, for a server, waits for TERM (as a real server would); for the trainer it
exits at once; asked who holds a port after a health wait, it answers "the step" unless the
port is ``FAKE_PORT_HELD`` (slurm/lib.sh's real check: tests/test_own_process_waits.py).
Everything else (bash, the placement CLI, YAML generation) is the real thing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.fakes import free_port, health_server

REPO = Path(__file__).resolve().parents[2]

FAKES = {
    "scontrol": """#!/usr/bin/env bash
[[ $1 == show && $2 == hostnames ]] || exit 9
tr ' ' '\\n' <<<"$FAKE_HOSTS"
""",
    "srun": """#!/usr/bin/env bash
if [[ " $* " == *" --job-name=atropos-port-check "* ]]; then  # who holds port ${*: -2:1}?
    [[ ${*: -2:1} == "${FAKE_PORT_HELD:-}" ]] || exit 0
    printf 'pid 4242 (decoy)'
    exit 1
fi
printf '%s\\0' "$@" >"$FAKE_DIR/srun/$$.args"
echo $$ >"$FAKE_DIR/pids/$$"
name=""
for arg in "$@"; do [[ $arg == --job-name=* ]] && name=${arg#--job-name=}; done
printf '%s\\n' "${ATROPOS_API_KEY:-}" "${ATROPOS_ADMIN_API_KEY:-}" \\
    "${ATROPOS_OPENAI__API_KEY:-}" "${VLLM_API_KEY:-}" "${ATROPOS_TRAINER_BROKER_API_KEY:-}" \\
    >"$FAKE_DIR/keys-$name"
[[ -n ${FAKE_FAIL:-} && $name == "$FAKE_FAIL" ]] && exit 3
if [[ $name == trainer && -z ${FAKE_TRAINER_HANGS:-} ]]; then
    sleep 0.5
    exit "${FAKE_TRAINER_STATUS:-0}"
fi
trap 'echo "$name" >>"$FAKE_DIR/terminated"; exit 0' TERM
sleep 60 &
wait
""",
    "scancel": """#!/usr/bin/env bash
echo "$*" >>"$FAKE_DIR/scancel"
for f in "$FAKE_DIR"/pids/*; do kill -TERM "$(cat "$f")" 2>/dev/null; done
exit 0
""",
    "curl": """#!/usr/bin/env bash
url=${*: -1}
if [[ -f $FAKE_DIR/unhealthy ]] && grep -qF "$url" "$FAKE_DIR/unhealthy"; then exit 7; fi
if [[ -n ${FAKE_BROKER_KEY:-} && $url == *:8000/health ]]; then  # a locked broker: 401
    prev=""
    for arg in "$@"; do
        if [[ $prev == --header ]] && grep -qxF "Authorization: Bearer $FAKE_BROKER_KEY" "${arg#@}"
        then exit 0; fi
        prev=$arg
    done
    exit 22
fi
exit 0
""",
}


@dataclass
class Job:
    returncode: int
    output: str
    root: Path
    launches: list[list[str]]
    terminated: list[str]

    def launched(self, name: str) -> list[list[str]]:
        return [argv for argv in self.launches if f"--job-name={name}" in argv]

    def names(self) -> list[str]:
        return sorted(a.split("=", 1)[1] for argv in self.launches for a in argv
                      if a.startswith("--job-name="))  # fmt: skip


def value_after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def start_job(tmp_path: Path, config: str, hosts: list[str], **env: str) -> subprocess.Popen[str]:
    root = tmp_path / "submit"
    (root / "slurm").mkdir(parents=True)
    for name in ("atropos.sbatch", "lib.sh"):
        shutil.copy(REPO / "slurm" / name, root / "slurm" / name)
    shutil.copytree(REPO / "configs", root / "configs")
    for env_file in (root / "configs" / config).glob("env-*.yaml"):
        script = root / "environments" / env_file.stem.removeprefix("env-") / "env.py"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text("# stand-in: srun is fake, nothing runs this\n")
    fake_dir, bin_dir = tmp_path / "fake", tmp_path / "bin"
    for folder in (fake_dir / "srun", fake_dir / "pids", bin_dir):
        folder.mkdir(parents=True)
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    job_env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "PYTHONPATH": str(REPO),
        "PYTHON": sys.executable,
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "fake-list",
        "SLURM_SUBMIT_DIR": str(root),
        "FAKE_HOSTS": " ".join(hosts),
        "FAKE_DIR": str(fake_dir),
        "ATROPOS_STOP_GRACE": "10",
        **env,
    }
    return subprocess.Popen(
        ["bash", str(root / "slurm" / "atropos.sbatch"), f"configs/{config}"],
        cwd=root, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finish_job(tmp_path: Path, process: subprocess.Popen[str]) -> Job:
    output, _ = process.communicate(timeout=120)
    fake_dir = tmp_path / "fake"
    launches = [
        path.read_bytes().decode().split("\0")[:-1]
        for path in sorted((fake_dir / "srun").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    ]
    terminated_file = fake_dir / "terminated"
    terminated = terminated_file.read_text().split() if terminated_file.exists() else []
    return Job(process.returncode, output, tmp_path / "submit", launches, terminated)


def run_job(tmp_path: Path, config: str, hosts: list[str], **env: str) -> Job:
    return finish_job(tmp_path, start_job(tmp_path, config, hosts, **env))


def test_multi_node_places_broker_servers_trainer_and_envs(tmp_path: Path) -> None:
    hosts = ["gpu001", "gpu002", "gpu003", "gpu004"]
    job = run_job(tmp_path, "multi-node", hosts, MODEL="org/model")
    assert job.returncode == 0, job.output
    servers = [f"inference-{node}-{port}" for node in hosts[1:] for port in range(9000, 9004)]
    assert job.names() == sorted(["broker", "env-gsm8k", "env-math", "trainer", *servers])
    broker = job.launched("broker")[0]
    assert "--nodelist=gpu001" in broker and "--kill-on-bad-exit=1" in broker
    assert value_after(broker, "--host") == "0.0.0.0"
    assert value_after(broker, "--max-queued-groups") == "50000"
    server = job.launched("inference-gpu003-9002")[0]
    assert "--nodelist=gpu003" in server and "CUDA_VISIBLE_DEVICES=4,5" in server
    assert value_after(server, "-m") == "atroposlib.cli.sglang_keyed"  # --api-key, from the env
    assert value_after(server, "--tp-size") == "2" and "--api-key" not in server
    assert value_after(server, "--port") == "9002" and value_after(server, "--model-path") == (
        "org/model"
    )
    trainer = job.launched("trainer")[0]
    assert "--nodelist=gpu001" in trainer and "torch.distributed.run" in trainer
    assert value_after(trainer, "--nproc-per-node") == "8"
    assert value_after(trainer, "--rdzv-endpoint") == "gpu001:29500"
    urls = json.loads(value_after(trainer, "--inference-urls"))
    assert len(urls) == 12 and urls[0] == "http://gpu002:9000" and urls[-1] == "http://gpu004:9003"
    assert value_after(trainer, "--broker-url") == "http://gpu001:8000"
    env = job.launched("env-math")[0]
    assert "--nodelist=gpu001" in env and value_after(env, "--env.tokenizer_name") == "org/model"
    generated = yaml.safe_load((job.root / value_after(env, "--config")).read_text())
    assert [s["base_url"] for s in generated["openai"]] == [f"{u}/v1" for u in urls]
    assert {s["server_type"] for s in generated["openai"]} == {"sglang"}
    assert generated["env"]["min_batch_allocation"] == 0.25
    assert sorted(job.terminated) == sorted(["broker", "env-gsm8k", "env-math", *servers])
    log_dir = job.root / "logs" / "77"
    assert (log_dir / "plan.txt").read_text().splitlines()[0] == (
        "gpu002 9000 0,1 http://gpu002:9000/v1"
    )
    assert len((log_dir / "commands.tsv").read_text().splitlines()) == len(job.launches)


def test_one_gpu_run_shares_the_node_and_lets_the_trainer_own_vllm(tmp_path: Path) -> None:
    job = run_job(tmp_path, "gsm8k-1gpu", ["n1"])
    assert job.returncode == 0, job.output
    assert job.names() == ["broker", "env-gsm8k", "trainer"]
    trainer = job.launched("trainer")[0]
    assert "torch.distributed.run" not in trainer and "CUDA_VISIBLE_DEVICES=0" in trainer
    assert value_after(trainer, "--inference-urls") == '["http://n1:9000"]'
    assert value_after(trainer, "--config") == "configs/gsm8k-1gpu/trainer.yaml"
    assert "waiting for trainer at http://n1:9000/health" in job.output


def test_one_node_multi_env_splits_gpus_between_trainer_and_servers(tmp_path: Path) -> None:
    job = run_job(tmp_path, "multi-env-1node", ["node7"])
    assert job.returncode == 0, job.output
    servers = {name: job.launched(name)[0] for name in job.names() if name.startswith("infer")}
    assert sorted(servers) == [f"inference-node7-{p}" for p in range(9000, 9004)]
    assert [next(a for a in argv if a.startswith("CUDA_VISIBLE_DEVICES")) for argv in
            servers.values()] == [f"CUDA_VISIBLE_DEVICES={g}" for g in range(4, 8)]  # fmt: skip
    trainer = job.launched("trainer")[0]
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in trainer
    assert value_after(trainer, "--nproc-per-node") == "4"
    assert {n for n in job.names() if n.startswith("env-")} == {
        "env-math", "env-code_execution", "env-tool_calling"
    }  # fmt: skip


def test_a_server_that_dies_fails_the_job_before_the_trainer_starts(tmp_path: Path) -> None:
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "unhealthy").write_text("http://gpu002:9001/health\n")
    job = run_job(tmp_path, "multi-node", ["gpu001", "gpu002"], FAKE_FAIL="inference-gpu002-9001")
    assert job.returncode == 1
    assert "inference-gpu002-9001 exited before it was healthy" in job.output
    assert not job.launched("trainer") and not job.launched("env-gsm8k")
    assert "broker" in job.terminated and "inference-gpu002-9000" in job.terminated


def test_a_port_another_process_holds_fails_the_job_before_the_trainer_starts(
    tmp_path: Path,
) -> None:
    job = run_job(tmp_path, "multi-node", ["gpu001", "gpu002"], FAKE_PORT_HELD="9001")
    assert job.returncode == 1
    assert (
        "error: inference-gpu002-9001: http://gpu002:9001/health answered, but port "
        "gpu002:9001 is held by pid 4242 (decoy), not by inference-gpu002-9001"
    ) in job.output
    assert "inference-gpu002-9001 is healthy" not in job.output
    assert not job.launched("trainer") and not job.launched("env-gsm8k")


def test_a_taken_broker_port_stops_the_job_before_anything_starts(tmp_path: Path) -> None:
    port = free_port()
    with health_server(port):
        job = run_job(tmp_path, "slurm-cpu-trial", ["127.0.0.1"], BROKER_PORT=str(port))
    assert job.returncode == 1 and job.launches == []
    assert f"error: port 127.0.0.1:{port} is already in use; not starting broker" in job.output


def test_a_failing_trainer_is_the_jobs_exit_status(tmp_path: Path) -> None:
    job = run_job(tmp_path, "slurm-cpu-trial", ["cpu1"], FAKE_TRAINER_STATUS="5")
    assert job.returncode == 5, job.output
    assert sorted(job.terminated) == ["broker", "env-reasoning_gym", "inference-cpu1-9000"]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"INFER_TP": "16"}, "INFER_TP=16 spans 2 nodes"),
        ({"INFER_ENGINE": "tgi"}, "INFER_ENGINE=tgi"),
        ({"INFER_TP": "two"}, "INFER_TP='two' is not an integer"),
    ],
)
def test_bad_placement_settings_stop_the_job_with_a_reason(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    job = run_job(tmp_path, "multi-node", ["a", "b"], **env)  # the caller's values win
    assert job.returncode != 0
    assert message in job.output
    assert not job.launched("trainer")


def test_sigterm_to_the_batch_script_stops_every_component(tmp_path: Path) -> None:
    """What happens at the time limit (--signal=B:TERM@120) or on scancel of the batch step."""
    process = start_job(tmp_path, "slurm-cpu-trial", ["cpu1"], FAKE_TRAINER_HANGS="1")
    commands = tmp_path / "submit" / "logs" / "77" / "commands.tsv"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if commands.exists() and "env-reasoning_gym" in commands.read_text():
            break
        time.sleep(0.2)
    time.sleep(1)
    process.send_signal(signal.SIGTERM)
    job = finish_job(tmp_path, process)
    assert job.returncode == 143, job.output
    assert sorted(job.terminated) == sorted(
        ["broker", "env-reasoning_gym", "inference-cpu1-9000", "trainer"]
    )
    assert "stopping 4 component(s)" in job.output


def test_scripts_pass_bash_n_and_shellcheck() -> None:
    scripts = [REPO / "slurm" / "atropos.sbatch", REPO / "slurm" / "lib.sh",
               REPO / "scripts" / "test-slurm"]  # fmt: skip
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    result = subprocess.run([shellcheck, "-x", *map(str, scripts)], cwd=REPO,
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout


def keys_seen(tmp_path: Path, job: Job) -> dict[str, dict[str, str]]:
    """The key variables each launched step ran with (the fake srun records them)."""
    names = ("ATROPOS_API_KEY", "ATROPOS_ADMIN_API_KEY", "ATROPOS_OPENAI__API_KEY",
             "VLLM_API_KEY", "ATROPOS_TRAINER_BROKER_API_KEY")  # fmt: skip
    seen = {}
    for name in job.names():
        values = (tmp_path / "fake" / f"keys-{name}").read_text().split("\n")[: len(names)]
        seen[name] = dict(zip(names, values, strict=True))
    return seen


def test_the_run_key_reaches_every_step_the_admin_key_only_servers_and_trainer(
    tmp_path: Path,
) -> None:
    run, admin = "job-secret-123", "job-admin-789"
    job = run_job(tmp_path, "slurm-cpu-trial", ["cpu1"], ATROPOS_API_KEY=run,
                  ATROPOS_ADMIN_API_KEY=admin, VLLM_API_KEY=admin,
                  ATROPOS_TRAINER_BROKER_API_KEY=admin, FAKE_BROKER_KEY=run)  # fmt: skip
    assert job.returncode == 0, job.output  # the broker's /health was asked with the run key
    seen = keys_seen(tmp_path, job)
    assert set(seen) == {"broker", "inference-cpu1-9000", "trainer", "env-reasoning_gym"}
    for name, keys in seen.items():
        holds_admin = not name.startswith("env-")
        assert keys == {"ATROPOS_API_KEY": run, "ATROPOS_OPENAI__API_KEY": run,
                        "ATROPOS_ADMIN_API_KEY": admin if holds_admin else "",
                        "VLLM_API_KEY": "", "ATROPOS_TRAINER_BROKER_API_KEY": ""}, name  # fmt: skip
    logs = job.root / "logs" / "77"
    written = job.output + "".join(p.read_text() for p in logs.iterdir() if p.is_file())
    assert admin not in written and run not in written.replace(f"{run}\n", "", 1)
    assert (logs / "api_key").read_text() == f"{run}\n"  # for the viewer: the run key only
    assert not any(key in arg for argv in job.launches for arg in argv for key in (run, admin))


def test_without_given_keys_the_job_generates_two_distinct_ones(tmp_path: Path) -> None:
    job = run_job(tmp_path, "slurm-cpu-trial", ["cpu1"])
    assert job.returncode == 0, job.output
    seen = keys_seen(tmp_path, job)
    run, admin = seen["trainer"]["ATROPOS_API_KEY"], seen["trainer"]["ATROPOS_ADMIN_API_KEY"]
    assert len(run) >= 40 and len(admin) >= 40 and run != admin  # 256 random bits each
    assert seen["env-reasoning_gym"]["ATROPOS_ADMIN_API_KEY"] == ""
    assert seen["broker"]["ATROPOS_ADMIN_API_KEY"] == admin
    saved = job.root / "logs" / "77" / "api_key"
    assert saved.read_text().strip() == run and stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert not any(key in arg for argv in job.launches for arg in argv for key in (run, admin))
    other = run_job(tmp_path / "again", "slurm-cpu-trial", ["cpu1"])
    assert (other.root / "logs" / "77" / "api_key").read_text().strip() != run


@pytest.mark.parametrize(
    ("keys", "why"),
    [({"ATROPOS_ADMIN_API_KEY": ""}, "ATROPOS_ADMIN_API_KEY is set but empty"),
     ({"ATROPOS_API_KEY": "same", "ATROPOS_ADMIN_API_KEY": "same"}, "equals ATROPOS_API_KEY")],
)  # fmt: skip
def test_an_empty_or_shared_admin_key_stops_the_job_before_anything_starts(
    tmp_path: Path, keys: dict[str, str], why: str
) -> None:
    job = run_job(tmp_path, "slurm-cpu-trial", ["cpu1"], **keys)
    assert job.returncode != 0 and why in job.output and job.launches == []


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_vllm_and_sglang_get_the_jobs_key_for_every_route_off_the_command_line(
    tmp_path: Path, engine: str
) -> None:
    key = "job-secret-456"
    job = run_job(tmp_path, "multi-node", ["g1", "g2"], MODEL="org/model", INFER_ENGINE=engine,
                  ATROPOS_API_KEY=key)  # fmt: skip
    assert job.returncode == 0, job.output
    name = "inference-g2-9000"
    server = job.launched(name)[0]
    if engine == "vllm":  # the middleware guards the dev-mode routes /v1's key leaves open
        assert value_after(server, "-m") == "vllm.entrypoints.openai.api_server"
        assert value_after(server, "--middleware") == "atroposlib.vllm_plugin.guard.VllmGuard"
        # the routes an in-flight push uses (pause, reload, version), under that middleware
        assert "VLLM_SERVER_DEV_MODE=1" in server[: server.index("-m")]
    else:  # the launcher puts our guard, with the keys, around SGLang's app
        assert value_after(server, "-m") == "atroposlib.cli.sglang_keyed"
    assert (tmp_path / "fake" / f"keys-{name}").read_text().split("\n")[0] == key
    assert not any(key in arg for arg in server) and "--api-key" not in server


def test_sglang_keyed_gives_sglang_no_key_and_refuses_what_would_leak_or_open_it() -> None:
    from atroposlib.cli.sglang_keyed import server_argv

    keyed = server_argv(["--port", "1"], {"ATROPOS_API_KEY": "k"})
    assert keyed == ["--port", "1", "--skip-server-warmup"]  # no --api-key: nothing to log
    for environ, argv, why in [
        ({}, [], "is not set"),
        ({"ATROPOS_API_KEY": " "}, [], "set but empty"),
        ({"ATROPOS_API_KEY": "k"}, ["--api-key=k"], "shows in ps"),
        ({"ATROPOS_API_KEY": "k"}, ["--admin-api-key", "a"], "shows in ps"),
        ({"ATROPOS_API_KEY": "k"}, ["--tokenizer-worker-num", "4"], "without the guard"),
    ]:
        with pytest.raises(ValueError, match=why):
            server_argv(argv, environ)


def test_an_empty_key_stops_the_job_before_anything_starts(tmp_path: Path) -> None:
    job = run_job(tmp_path, "slurm-cpu-trial", ["cpu1"], ATROPOS_API_KEY="")
    assert job.returncode != 0
    assert "ATROPOS_API_KEY is set but empty" in job.output
    assert job.launches == []


def test_every_shipped_vllm_command_returns_the_logprobs_of_what_it_sampled() -> None:
    """docs/engines.md: without --logprobs-mode processed_logprobs vLLM returns the untempered
    model's logprobs, and the trainer's ratio and corrections are wrong."""
    import yaml

    commands = [
        str(yaml.safe_load(path.read_text()).get("vllm_command", ""))
        for path in sorted((REPO / "configs").rglob("*.yaml"))
    ]
    sbatch = (REPO / "slurm/atropos.sbatch").read_text()
    vllm_launch = sbatch[sbatch.index("vllm) INFER_CMD") :].split(";;")[0]
    launches = [c for c in [*commands, vllm_launch] if "vllm.entrypoints.openai.api_server" in c]
    assert len(launches) >= 2, "the sbatch script's and the gsm8k-1gpu config's"
    for launch in launches:
        assert "--logprobs-mode processed_logprobs" in " ".join(launch.split()), launch
