"""Inference server discovery: SLURM node lists, and where servers without a URL live."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class InferenceServer:
    """One inference server of a job: where it listens and which GPUs of its node it uses."""

    node: str
    port: int
    gpus: tuple[int, ...]
    span: tuple[str, ...]

    @property
    def base_url(self) -> str:
        """The server's root (health, weight reload): ``http://node:port``."""
        return f"http://{self.node}:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL environments use: ``http://node:port/v1``."""
        return f"{self.base_url}/v1"


def plan_inference_servers(
    nodes: Sequence[str],
    *,
    training_nodes: int = 1,
    tp: int = 1,
    gpus_per_node: int = 8,
    port: int = FIRST_INFERENCE_PORT,
    skip_gpus: int = 0,
) -> list[InferenceServer]:
    """Place data-parallel inference servers of ``tp`` GPUs each on the job's nodes.

    The first ``training_nodes`` nodes belong to the trainer (0: the trainer shares node 0).
    On every other node the first ``skip_gpus`` GPUs are left out (for a co-located trainer)
    and the rest hold ``(gpus_per_node - skip_gpus) // tp`` servers on ports ``port``,
    ``port + 1``... A server whose TP exceeds a node spans ``ceil(tp / gpus_per_node)`` whole
    nodes and is reached on the first of them.

    >>> [s.url for s in plan_inference_servers(["a", "b"], tp=4, gpus_per_node=8)]
    ['http://b:9000/v1', 'http://b:9001/v1']
    >>> plan_inference_servers(["a"], training_nodes=0, tp=2, gpus_per_node=4, skip_gpus=2)
    [InferenceServer(node='a', port=9000, gpus=(2, 3), span=('a',))]
    """
    if tp < 1 or gpus_per_node < 1 or training_nodes < 0 or not 0 <= skip_gpus < gpus_per_node:
        raise ConfigError(
            f"need INFER_TP >= 1, GPUS_PER_NODE >= 1, NUM_TRAINING_NODES >= 0 and "
            f"0 <= INFER_SKIP_GPUS < GPUS_PER_NODE (got tp={tp}, gpus_per_node={gpus_per_node}, "
            f"training_nodes={training_nodes}, skip_gpus={skip_gpus})"
        )
    inference_nodes = list(nodes[training_nodes:])
    if not inference_nodes:
        raise ConfigError(
            f"SLURM job has {len(nodes)} nodes and NUM_TRAINING_NODES={training_nodes}: "
            "no node is left for inference; lower NUM_TRAINING_NODES or add nodes"
        )
    usable = gpus_per_node - skip_gpus
    servers: list[InferenceServer] = []
    if tp <= usable:
        if usable % tp:
            logger.warning("%d GPUs per node stay idle: %d is not a multiple of TP %d",
                           usable % tp, usable, tp)  # fmt: skip
        for node in inference_nodes:
            for i in range(usable // tp):
                first = skip_gpus + i * tp
                servers.append(InferenceServer(node, port + i, tuple(range(first, first + tp)),
                                               (node,)))  # fmt: skip
        return servers
    if skip_gpus:
        raise ConfigError(
            f"INFER_TP={tp} needs whole nodes, but INFER_SKIP_GPUS={skip_gpus} keeps GPUs back; "
            "set INFER_SKIP_GPUS=0 or lower INFER_TP"
        )
    span = -(-tp // gpus_per_node)
    for first in range(0, len(inference_nodes) - span + 1, span):
        nodes_of_server = tuple(inference_nodes[first : first + span])
        servers.append(
            InferenceServer(nodes_of_server[0], port, tuple(range(gpus_per_node)), nodes_of_server)
        )
    if not servers:
        raise ConfigError(
            f"INFER_TP={tp} spans {span} nodes of {gpus_per_node} GPUs, but only "
            f"{len(inference_nodes)} inference node(s) are left; add nodes or lower INFER_TP"
        )
    return servers


def _int_var(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name, "")
    if raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer; set it to a whole number") from None


def plan_from_environ(environ: Mapping[str, str]) -> list[InferenceServer]:
    """``plan_inference_servers`` from the job's variables.

    ``SLURM_JOB_NODELIST``; ``NUM_TRAINING_NODES`` (default 1); ``INFER_TP`` (GPUs per server,
    default 1); ``GPUS_PER_NODE`` (default ``SLURM_GPUS_ON_NODE``, else 8); ``INFER_PORT``
    (first port, default 9000); ``INFER_SKIP_GPUS`` (default 0).
    """
    gpus_default = _int_var(environ, "SLURM_GPUS_ON_NODE", 8)
    return plan_inference_servers(
        expand_nodelist(environ.get("SLURM_JOB_NODELIST", "")),
        training_nodes=_int_var(environ, "NUM_TRAINING_NODES", 1),
        tp=_int_var(environ, "INFER_TP", 1),
        gpus_per_node=_int_var(environ, "GPUS_PER_NODE", gpus_default),
        port=_int_var(environ, "INFER_PORT", FIRST_INFERENCE_PORT),
        skip_gpus=_int_var(environ, "INFER_SKIP_GPUS", 0),
    )


def slurm_inference_urls(environ: Mapping[str, str]) -> list[str]:
    """One ``http://node:port/v1`` per inference server of the job (see ``plan_from_environ``)."""
    return [server.url for server in plan_from_environ(environ)]


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


if __name__ == "__main__":
    # The documented ``python -m atroposlib.envs.server_handling.slurm`` runs the CLI, which
    # lives above this module (cli -> envs); run it by name so no import points back up.
    import runpy

    runpy.run_module("atroposlib.cli.slurm_plan", run_name="__main__", alter_sys=True)
