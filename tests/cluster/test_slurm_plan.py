"""Node-list expansion, inference placement for any TP, and the slurm_plan CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from atroposlib.cli import slurm_plan
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.slurm import (
    expand_nodelist,
    plan_from_environ,
    plan_inference_servers,
    resolve_server_configs,
    slurm_inference_urls,
)
from atroposlib.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node[001-003,007]", ["node001", "node002", "node003", "node007"]),
        ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("a[1-2],b[09-10],login", ["a1", "a2", "b09", "b10", "login"]),
        ("rack[1-2]-n[0-1]", ["rack1-n0", "rack1-n1", "rack2-n0", "rack2-n1"]),
        ("single", ["single"]),
        ("x1,x2", ["x1", "x2"]),
        ("", []),
    ],
)
def test_expand_nodelist(nodelist: str, hosts: list[str]) -> None:
    assert expand_nodelist(nodelist) == hosts


def test_expand_nodelist_names_a_bad_range() -> None:
    with pytest.raises(ConfigError, match="cannot read range 'a-b'"):
        expand_nodelist("n[a-b]")


@pytest.mark.parametrize(
    ("tp", "gpus", "per_node", "first_gpus"),
    [(1, 8, 8, (0,)), (2, 8, 4, (0, 1)), (4, 8, 2, (0, 1, 2, 3)), (8, 8, 1, tuple(range(8))),
     (3, 8, 2, (0, 1, 2)), (2, 4, 2, (0, 1)), (1, 1, 1, (0,))],
)  # fmt: skip
def test_servers_per_node_follow_tp(
    tp: int, gpus: int, per_node: int, first_gpus: tuple[int, ...]
) -> None:
    nodes = expand_nodelist("node[001-003,007]")
    servers = plan_inference_servers(nodes, tp=tp, gpus_per_node=gpus, port=9100)
    assert len(servers) == 3 * per_node
    assert servers[0].node == "node002" and servers[0].gpus == first_gpus
    assert servers[-1].node == "node007" and servers[-1].port == 9100 + per_node - 1
    used = [gpu for s in servers if s.node == "node003" for gpu in s.gpus]
    assert len(used) == len(set(used)) == per_node * tp, "GPUs of a node never overlap"


def test_tp_wider_than_a_node_spans_whole_nodes() -> None:
    servers = plan_inference_servers([f"n{i}" for i in range(1, 8)], tp=16, gpus_per_node=8)
    assert [(s.node, s.span) for s in servers] == [
        ("n2", ("n2", "n3")), ("n4", ("n4", "n5")), ("n6", ("n6", "n7"))
    ]  # fmt: skip
    odd = plan_inference_servers(["t", "a", "b"], tp=12, gpus_per_node=8)
    assert [s.url for s in odd] == ["http://a:9000/v1"]
    with pytest.raises(ConfigError, match="only 1 inference node"):
        plan_inference_servers(["t", "a"], tp=16, gpus_per_node=8)


def test_colocated_trainer_keeps_the_first_gpus() -> None:
    servers = plan_inference_servers(["solo"], training_nodes=0, tp=2, gpus_per_node=8,
                                     skip_gpus=4)  # fmt: skip
    assert [(s.port, s.gpus) for s in servers] == [(9000, (4, 5)), (9001, (6, 7))]
    with pytest.raises(ConfigError, match="INFER_SKIP_GPUS"):
        plan_inference_servers(["solo"], training_nodes=0, gpus_per_node=8, skip_gpus=8)
    with pytest.raises(ConfigError, match="needs whole nodes"):
        plan_inference_servers(["a", "b"], tp=16, gpus_per_node=8, skip_gpus=2)


def test_environment_variables_are_integers_with_a_clear_error() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "INFER_TP": "2", "GPUS_PER_NODE": "4",
           "INFER_PORT": "9500"}  # fmt: skip
    assert slurm_inference_urls(env) == ["http://n2:9500/v1", "http://n2:9501/v1"]
    assert plan_from_environ({**env, "GPUS_PER_NODE": "", "SLURM_GPUS_ON_NODE": "2"})[0].gpus == (
        0, 1
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"INFER_TP='2\.0' is not an integer"):
        slurm_inference_urls({**env, "INFER_TP": "2.0"})


def test_env_discovery_uses_the_same_plan() -> None:
    env = {"SLURM_JOB_NODELIST": "gpu[001-002]", "INFER_TP": "4", "GPUS_PER_NODE": "8",
           "INFER_PORT": "9200"}  # fmt: skip
    template = [APIServerConfig(base_url="http://x/v1", model_name="m", server_type="sglang")]
    resolved = resolve_server_configs(template, slurm=True, environ=env)
    assert [(c.base_url, c.server_type) for c in resolved] == [
        ("http://gpu002:9200/v1", "sglang"), ("http://gpu002:9201/v1", "sglang")
    ]  # fmt: skip


def test_cli_formats(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--nodelist", "node[001-002]", "--tp", "4", "--gpus-per-node", "8", "--port", "9000"]
    assert slurm_plan.main(args, environ={}) == 0
    assert capsys.readouterr().out == "http://node002:9000/v1\nhttp://node002:9001/v1\n"
    assert slurm_plan.main([*args, "--format", "table"], environ={}) == 0
    assert capsys.readouterr().out.splitlines()[1] == "node002 9001 4,5,6,7 http://node002:9001/v1"
    assert slurm_plan.main([*args, "--format", "trainer-urls"], environ={}) == 0
    assert json.loads(capsys.readouterr().out) == ["http://node002:9000", "http://node002:9001"]
    assert slurm_plan.main(["--format", "json"], environ={"SLURM_JOB_NODELIST": "a,b"}) == 0
    assert len(json.loads(capsys.readouterr().out)) == 8
    assert slurm_plan.main(["--nodelist", "only"], environ={}) == 2
    assert "no node is left for inference" in capsys.readouterr().err


def test_cli_env_config_lists_every_server(tmp_path: Path) -> None:
    source = tmp_path / "env.yaml"
    source.write_text("env:\n  group_size: 4\nopenai:\n  model_name: default\n  api_key: x\n")
    out = tmp_path / "out.yaml"
    code = slurm_plan.main(["--nodelist", "a,b", "--gpus-per-node", "2", "--env-config",
                            str(source), "--out", str(out)], environ={})  # fmt: skip
    assert code == 0
    data = yaml.safe_load(out.read_text())
    assert data["env"] == {"group_size": 4}
    assert data["openai"] == [
        {"model_name": "default", "api_key": "x", "base_url": "http://b:9000/v1"},
        {"model_name": "default", "api_key": "x", "base_url": "http://b:9001/v1"},
    ]


def test_cli_broker_flags_parse_with_run_api(tmp_path: Path) -> None:
    from atroposlib.cli.run_api import parse_settings

    source = tmp_path / "broker.yaml"
    source.write_text("max_queued_groups: 10\ncors_origins: [http://x]\nlog_level: debug\n")
    flags = slurm_plan.broker_flags(source)
    assert flags[:2] == ["--max-queued-groups", "10"]
    settings = parse_settings(flags)
    assert settings.max_queued_groups == 10 and settings.cors_origins == ["http://x"]


@pytest.mark.parametrize(
    ("field", "variable"),
    [("api_key", "ATROPOS_API_KEY"), ("admin_api_key", "ATROPOS_ADMIN_API_KEY")],
)
def test_broker_flags_refuse_a_key_that_would_show_on_the_command_line(
    tmp_path: Path, field: str, variable: str
) -> None:
    source = tmp_path / "broker.yaml"
    source.write_text(f"{field}: s3cret\n")
    with pytest.raises(ConfigError, match=f"export {variable} for the job") as err:
        slurm_plan.broker_flags(source)
    assert "s3cret" not in str(err.value)


def test_module_entry_point_runs_as_a_process() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "atroposlib.envs.server_handling.slurm", "--tp", "2",
         "--gpus-per-node", "8", "--port", "9000", "--nodelist", "n[1-2]"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [f"http://n2:{p}/v1" for p in range(9000, 9004)]
    bad = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.slurm_plan", "--format", "xml"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr  # no usage dump


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        slurm_plan.main(["--help"], environ={})
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    flags = [
        "--nodelist",
        "--training-nodes",
        "--tp",
        "--gpus-per-node",
        "--port",
        "--skip-gpus",
        "--format {urls,table,trainer-urls,json}",
        "--env-config",
        "--out",
        "--broker-flags",
    ]
    assert [flag for flag in flags if flag not in out] == []
    assert "(default $SLURM_JOB_NODELIST)" in out
