"""``python -m atroposlib.cli.slurm_plan``: where a SLURM job's inference servers go.

The sbatch scripts in slurm/ ask this module (one implementation, unit-tested) instead of
doing arithmetic in bash. Every option defaults to the job's variables (see
``atroposlib.envs.server_handling.slurm.plan_from_environ``)::

    python -m atroposlib.cli.slurm_plan --tp 2 --gpus-per-node 8 --port 9000      # URLs
    python -m atroposlib.cli.slurm_plan --format table     # node port gpus url, one a line
    python -m atroposlib.cli.slurm_plan --format trainer-urls   # JSON list for the trainer
    python -m atroposlib.cli.slurm_plan --env-config configs/x/env-gsm8k.yaml --out run.yaml
    python -m atroposlib.cli.slurm_plan --broker-flags configs/x/broker.yaml

``--env-config`` writes a copy of an environment YAML whose ``openai:`` lists every server
(each entry is the file's ``openai`` settings with its own ``base_url``). ``--broker-flags``
prints the broker YAML as ``--kebab-flag value`` lines. Errors: one line, exit status 2.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from atroposlib.envs.server_handling.slurm import InferenceServer, plan_from_environ
from atroposlib.errors import ConfigError
from atroposlib.utils.cli import parse_command_line
from atroposlib.utils.cli_settings import CommandLineSettings

PROG = "python -m atroposlib.cli.slurm_plan"
_OPTIONS = {  # flag -> the job variable it overrides
    "nodelist": "SLURM_JOB_NODELIST",
    "training_nodes": "NUM_TRAINING_NODES",
    "tp": "INFER_TP",
    "gpus_per_node": "GPUS_PER_NODE",
    "port": "INFER_PORT",
    "skip_gpus": "INFER_SKIP_GPUS",
}


class SlurmPlanSettings(CommandLineSettings):
    """Print where a SLURM job's inference servers run (defaults: job variables)."""

    nodelist: str | None = Field(None, description="node list (default $SLURM_JOB_NODELIST)")
    training_nodes: str | None = Field(
        None,
        description="nodes kept for the trainer; 0 shares node 0 (default $NUM_TRAINING_NODES "
        "or 1)",
    )
    tp: str | None = Field(
        None, description="tensor-parallel GPUs per server (default $INFER_TP or 1)"
    )
    gpus_per_node: str | None = Field(
        None, description="GPUs per node (default $GPUS_PER_NODE or 8)"
    )
    port: str | None = Field(None, description="first server port on each node (default 9000)")
    skip_gpus: str | None = Field(
        None, description="GPUs left out at the start of each node (default $INFER_SKIP_GPUS or 0)"
    )
    format: Literal["urls", "table", "trainer-urls", "json"] = Field(
        "urls",
        description="urls: one /v1 URL a line; table: node port gpus url; trainer-urls: JSON "
        "list of server roots; json: the whole plan",
    )
    env_config: Path | None = Field(None, description="environment YAML to copy with servers")
    out: Path | None = Field(None, description="where --env-config writes (default stdout)")
    broker_flags: Path | None = Field(None, description="broker YAML to print as flags")


def job_variables(args: SlurmPlanSettings, environ: Mapping[str, str]) -> dict[str, str]:
    values = dict(environ)
    for option, variable in _OPTIONS.items():
        given = getattr(args, option)
        if given is not None:
            values[variable] = given
    return values


def render(servers: Sequence[InferenceServer], fmt: str) -> str:
    if fmt == "urls":
        return "".join(f"{s.url}\n" for s in servers)
    if fmt == "table":
        return "".join(f"{s.node} {s.port} {','.join(map(str, s.gpus))} {s.url}\n" for s in servers)
    if fmt == "trainer-urls":
        return json.dumps([s.base_url for s in servers]) + "\n"
    plan = [{"node": s.node, "port": s.port, "gpus": list(s.gpus), "span": list(s.span),
             "url": s.url} for s in servers]  # fmt: skip
    return json.dumps(plan, indent=2) + "\n"


def env_config_with_servers(path: Path, servers: Sequence[InferenceServer]) -> dict[str, Any]:
    """The env YAML at ``path`` with ``openai:`` replaced by one entry per server."""
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"--env-config: {path} must hold a mapping with env: and openai: keys")
    template = data.get("openai") or {}
    if isinstance(template, list):
        template = template[0] if template else {}
    data["openai"] = [{**template, "base_url": server.url} for server in servers]
    return data


def broker_flags(path: Path) -> list[str]:
    """``--kebab-name value`` pairs (lists as JSON) from a flat broker YAML mapping."""
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"--broker-flags: {path} must hold a mapping of broker settings")
    for field, variable in (("api_key", "ATROPOS_API_KEY"),
                            ("admin_api_key", "ATROPOS_ADMIN_API_KEY")):  # fmt: skip
        if field in data:
            raise ConfigError(
                f"--broker-flags: {path} sets {field}, which would put the key on the broker's "
                f"command line (ps, commands.tsv); remove it and export {variable} for the job"
            )
    flags: list[str] = []
    for name, value in data.items():
        flag = "--" + str(name).replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, list | dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = parse_command_line(SlurmPlanSettings, argv, PROG)
    try:
        if args.broker_flags is not None:
            sys.stdout.write("".join(f"{flag}\n" for flag in broker_flags(args.broker_flags)))
            return 0
        servers = plan_from_environ(job_variables(args, os.environ if environ is None else environ))
        if args.env_config is None:
            sys.stdout.write(render(servers, args.format))
            return 0
        text = yaml.safe_dump(env_config_with_servers(args.env_config, servers), sort_keys=False)
    except (ConfigError, OSError, yaml.YAMLError) as err:
        sys.stderr.write(f"slurm_plan: error: {err}\n")
        return 2
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
