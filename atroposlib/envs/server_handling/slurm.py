"""Inference server discovery: SLURM node lists, and where servers without a URL live."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence

from atroposlib.envs.server_handling.server_baseline import APIServerConfig, ServerBaseline
from atroposlib.errors import ConfigError

logger = logging.getLogger(__name__)

FIRST_INFERENCE_PORT = 9000
LOCAL_BASELINE_PORTS = (9004, 9005, 9006, 9007)
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM node list the way ``scontrol show hostnames`` does.

    >>> expand_nodelist("gpu[01-03,07],login1")
    ['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login1']
    >>> expand_nodelist("a[1-2]-ib[0-1]")
    ['a1-ib0', 'a1-ib1', 'a2-ib0', 'a2-ib1']
    """
    hosts: list[str] = []
    for part in _split_top_level(nodelist):
        hosts.extend(_expand_one(part))
    return hosts


def _split_top_level(nodelist: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in nodelist.strip():
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p for p in [*parts, current] if p]


def _expand_one(pattern: str) -> list[str]:
    match = re.search(r"\[([^\]]+)\]", pattern)
    if match is None:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    out: list[str] = []
    for item in match.group(1).split(","):
        bounds = _RANGE.match(item.strip())
        if bounds is None:
            raise ConfigError(f"SLURM_JOB_NODELIST: cannot read range {item!r} in {pattern!r}")
        low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
        for number in range(int(low), int(high) + 1):
            out.extend(_expand_one(f"{head}{str(number).zfill(len(low))}{tail}"))
    return out


def slurm_inference_urls(environ: Mapping[str, str]) -> list[str]:
    """One URL per inference server on the job's inference nodes (those after the trainer's).

    Env vars: ``NUM_TRAINING_NODES`` (default 1), ``INFER_TP`` (GPUs per server, default 1),
    ``GPUS_PER_NODE`` (default ``SLURM_GPUS_ON_NODE`` or 8). A server whose TP spans several
    nodes is reached on the first node of its span.
    """
    nodes = expand_nodelist(environ.get("SLURM_JOB_NODELIST", ""))
    training = int(environ.get("NUM_TRAINING_NODES", "1"))
    tp = int(environ.get("INFER_TP", "1"))
    gpus = int(environ.get("GPUS_PER_NODE", environ.get("SLURM_GPUS_ON_NODE", "8")))
    if tp < 1 or gpus < 1:
        raise ConfigError("INFER_TP and GPUS_PER_NODE must be >= 1")
    inference_nodes = nodes[training:]
    if not inference_nodes:
        raise ConfigError(
            f"SLURM job has {len(nodes)} nodes and NUM_TRAINING_NODES={training}: "
            "no node is left for inference; lower NUM_TRAINING_NODES or add nodes"
        )
    urls: list[str] = []
    if tp <= gpus:
        for node in inference_nodes:
            urls.extend(f"http://{node}:{FIRST_INFERENCE_PORT + i}/v1" for i in range(gpus // tp))
    else:
        span = -(-tp // gpus)
        for first in range(0, len(inference_nodes) - span + 1, span):
            urls.append(f"http://{inference_nodes[first]}:{FIRST_INFERENCE_PORT}/v1")
    if not urls:
        raise ConfigError(f"INFER_TP={tp} needs more inference nodes than the job has")
    return urls


def resolve_server_configs(
    configs: ServerBaseline | Sequence[APIServerConfig],
    *,
    slurm: bool,
    environ: Mapping[str, str] | None = None,
) -> list[APIServerConfig]:
    """The concrete servers to talk to.

    A list (or a single ``APIServerConfig``) is used as given: one server per ``base_url``.
    A bare ``ServerBaseline``, or ``slurm=True``, discovers servers from the SLURM node list
    (with fewer than two nodes the given list stays). A bare baseline outside SLURM means
    the local ports 9004-9007, as in Atropos.
    """
    env = os.environ if environ is None else environ
    if isinstance(configs, APIServerConfig):
        configs = [configs]
    multi_node = len(expand_nodelist(env.get("SLURM_JOB_NODELIST", ""))) >= 2
    if isinstance(configs, ServerBaseline):
        template = APIServerConfig(**configs.model_dump(), api_key="x")
        if multi_node:
            urls = slurm_inference_urls(env)
        else:
            urls = [f"http://localhost:{port}/v1" for port in LOCAL_BASELINE_PORTS]
            logger.info("ServerBaseline without SLURM: using local ports %s", LOCAL_BASELINE_PORTS)
        return [template.model_copy(update={"base_url": url}) for url in urls]
    configs = list(configs)
    if not configs:
        raise ConfigError("no inference server configured: give at least one APIServerConfig")
    if slurm and multi_node:
        urls = slurm_inference_urls(env)
        logger.info("SLURM: %d inference servers discovered", len(urls))
        return [configs[0].model_copy(update={"base_url": url}) for url in urls]
    return configs
