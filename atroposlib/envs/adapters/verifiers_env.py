"""Any verifiers (v1) environment as a ``BaseEnv``: ``--env.vf_env NAME --env.vf_args '{...}'``.

The environment is loaded by its taskset id (an installed package or module, or a Hub id
``owner/name[@version]``) with ``vf_args`` as its taskset settings; ``vf_config`` sets the rest
of verifiers' env config (env id such as ``user-sim``, seat settings such as ``max_turns``).
Each item is one of its tasks; ``group_size`` episodes of it run through verifiers' own
``Env.run_episode`` (its harness loop, stops, tools, user simulators, scoring), with every
model call sampled token-in/token-out through our ``ServerManager`` (``vf_client``) and every
seat's program run in-process (``vf_harness``). A trace's token branch becomes the sequence;
its weighted reward the score; each reward function's and metric's value is kept per sequence
(``overrides.vf_rewards`` / ``vf_metrics``) and logged as a metric.

A group is posted only when every episode finished cleanly: a failure of the environment
(a reward function raising, a tool server gone, a timeout) drops the group and is counted by
its cause; an inference failure is infrastructure: the group is dropped, counted, and the
item retried later. Nothing is ever posted half-scored.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from atroposlib.envs.adapters import local_defaults, stop
from atroposlib.envs.adapters.vf_client import TokenRoute
from atroposlib.envs.adapters.vf_loader import VerifiersEnvConfig
from atroposlib.envs.base import BaseEnv
from atroposlib.envs.rollouts import trajectory_group
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.trajectory import Trajectory
from atroposlib.errors import ConfigError, InferenceUnavailableError
from atroposlib.group import MASK_IGNORE_INDEX, NOT_SAMPLED_VERSION, PROMPT_LOGPROB, ScoredData
from atroposlib.type_definitions import Item

logger = logging.getLogger(__name__)


def trajectory_from_trace(trace: Any, versions: Sequence[int | None] = ()) -> Trajectory:
    """The trace's one trainable token branch as a trajectory (ids exactly as sampled).

    ``versions`` are the engine's weight versions of the trace's replies in order (one per
    sampled node); when they do not line up, the trajectory carries none.
    """
    from verifiers.v1.dialects.chat import message_to_wire

    branches = [branch for branch in trace.branches if branch.trainable]
    if len(branches) != 1:
        raise ValueError(f"unsupported: the trace has {len(branches)} trainable branches")
    branch = branches[0]
    tokens, sampled = branch.token_ids, branch.sampled_mask
    if not any(sampled):
        raise ValueError("the trace has no sampled tokens")
    replies = [node for node in branch.nodes if any(node.mask)]
    aligned = len(versions) == len(replies) and None not in versions
    reply_versions = iter(versions if aligned else [NOT_SAMPLED_VERSION] * len(replies))
    token_versions: list[int] = []
    for node in branch.nodes:
        version = next(reply_versions) if any(node.mask) else None
        version = NOT_SAMPLED_VERSION if version is None else version
        token_versions += [version if flag else NOT_SAMPLED_VERSION for flag in node.mask]
    finish = branch.calls[-1].finish_reason if branch.calls else None
    return Trajectory(
        tokens=list(tokens),
        masks=[t if s else MASK_IGNORE_INDEX for t, s in zip(tokens, sampled, strict=True)],
        logprobs=[
            lp if s else PROMPT_LOGPROB for lp, s in zip(branch.logprobs, sampled, strict=True)
        ],
        versions=token_versions,
        messages=[message_to_wire(m) for m in branch.messages],
        finish_reason="length" if finish == "length" else "stop",
        reply=str(trace.last_reply or ""),
        turns=len(replies),
    )


def signals(trace: Any) -> dict[str, dict[str, float]]:
    """Each reward function's (unweighted) score and each metric of a finished trace."""
    rewards = {k: float(r.score) for k, r in trace.rewards.items() if r is not None}
    metrics = {k: float(v) for k, v in trace.metrics.items() if v is not None}
    return {"vf_rewards": rewards, "vf_metrics": metrics}


class VerifiersEnv(BaseEnv):
    name = "verifiers"
    env_config_cls = VerifiersEnvConfig
    config: VerifiersEnvConfig

    @classmethod
    def config_init(cls) -> tuple[VerifiersEnvConfig, list[APIServerConfig]]:
        return local_defaults(VerifiersEnvConfig)

    async def setup(self) -> None:
        from atroposlib.envs.adapters import vf_loader

        if not self.config.vf_env:
            raise ConfigError("--env.vf_env is required: the verifiers environment to load")
        if not any(server.supports_token_ids for server in self.server.servers):
            raise ConfigError("verifiers environments sample token ids: set server_type to "
                              "embedded, sglang or vllm")  # fmt: skip
        self.vf = vf_loader.load(self.config, self.config.vf_args)
        model = self.server.servers[0].config.model_name
        contexts = {
            split: vf_loader.model_context(
                self.config, self.server, self.tokenizer, model, split=split
            )
            for split in ("train", "eval")
        }
        self.ctx, self.eval_ctx = contexts["train"], contexts["eval"]
        self.failures: Counter[str] = Counter()
        self.signal_values: dict[str, list[float]] = defaultdict(list)
        self.tasks = self._task_stream()
        self._serving = await vf_loader.hold_serving(self.vf)

    def _task_stream(self) -> Iterator[Any]:
        taskset = self.vf.taskset
        if not taskset.bounded:
            yield from taskset
            return
        rng = random.Random(self.config.shuffle_seed)
        tasks = list(taskset)
        if not tasks:
            raise ConfigError(f"the taskset of {self.config.vf_env!r} has no tasks")
        while True:
            rng.shuffle(tasks)
            yield from tasks

    async def get_next_item(self) -> Item:
        return next(self.tasks)

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        runs = [self.vf.run_episode(item, self.ctx) for _ in range(self.config.group_size)]
        episodes = await asyncio.gather(*runs)
        lane = self._lane(self.ctx)
        traces, versions, cause = self._judge(episodes, lane)
        if cause is not None:
            self.failures[cause] += 1
            logger.warning("verifiers group dropped (%s): %s", cause, self._first_error(episodes))
            if cause.startswith("inference"):
                raise InferenceUnavailableError(f"inference failed during {self.config.vf_env}")
            return None, []
        trajectories = [trajectory_from_trace(t, v) for t, v in zip(traces, versions, strict=True)]
        extras = [signals(trace) for trace in traces]
        for extra in extras:
            for kind, values in extra.items():
                for name, value in values.items():
                    self.signal_values[f"{kind.removeprefix('vf_')}/{name}"].append(value)
        scores = [float(trace.reward) for trace in traces]
        params = lane.sampler.generation_params
        return trajectory_group(trajectories, scores, generation_params=params, extra=extras), []

    @staticmethod
    def _lane(ctx: Any) -> TokenRoute:
        from atroposlib.envs.adapters.vf_client import route

        return route(ctx.client.route)

    @staticmethod
    def _judge(
        episodes: list[Any], lane: TokenRoute
    ) -> tuple[list[Any], list[list[int | None]], str | None]:
        """The trace to train per episode with its replies' weight versions, or why the
        group cannot be posted. What the client recorded for the episodes is consumed."""
        every = [trace.id for episode in episodes for trace in episode.traces]
        broken = [lane.failed_sessions.pop(trace_id, None) for trace_id in every]
        versions = {trace_id: lane.versions.pop(trace_id, []) for trace_id in every}
        if any(broken):
            return [], [], "inference"
        traces: list[Any] = []
        for episode in episodes:
            if not episode.ok:
                error = episode.last_error or next(
                    (t.last_error for t in episode.traces if t.last_error), None
                )
                return [], [], f"env_error/{error.type if error else 'unknown'}"
            trainable = [trace for trace in episode.traces if trace.agent.trainable]
            if len(trainable) != 1:
                return [], [], f"unsupported/{len(trainable)}_trainable_traces"
            if len([b for b in trainable[0].branches if b.trainable]) != 1:
                return [], [], "unsupported/forked_trace"
            traces.append(trainable[0])
        return traces, [versions[trace.id] for trace in traces], None

    @staticmethod
    def _first_error(episodes: list[Any]) -> str:
        for episode in episodes:
            for error in [*episode.errors, *(e for t in episode.traces for e in t.errors)]:
                return f"{error.type}: {error.message[:300]}"
        return "no error recorded"

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        from atroposlib.envs.adapters import vf_loader

        started = time.time()
        eval_args = self.config.vf_eval_args
        taskset = vf_loader.load_taskset(self.config, self.config.vf_args if eval_args is None
                                         else eval_args)  # fmt: skip
        tasks = list(taskset.take(self.config.eval_size))
        episodes = await asyncio.gather(*(self.vf.run_episode(t, self.eval_ctx) for t in tasks))
        samples, failed = [], 0
        for task, episode in zip(tasks, episodes, strict=True):
            traces, _, cause = self._judge([episode], self._lane(self.eval_ctx))
            if cause is not None:
                failed += 1
                continue
            trace = traces[0]
            samples.append({"task": task.data.idx, "prompt": task.data.prompt_text,
                            "response": trace.last_reply, "score": float(trace.reward),
                            **signals(trace)})  # fmt: skip
        metrics = {"eval/failed": float(failed), "eval/episodes": float(len(samples))}
        if samples:
            metrics["eval/reward"] = sum(s["score"] for s in samples) / len(samples)
            for name in samples[0]["vf_rewards"]:
                values = [s["vf_rewards"].get(name, 0.0) for s in samples]
                metrics[f"eval/reward/{name}"] = sum(values) / len(values)
        await self.evaluate_log(metrics, samples=samples, start_time=started, end_time=time.time())

    async def close(self) -> None:
        """Leave verifiers' serving context (tool servers, interception) and close the servers."""
        await stop(getattr(self, "_serving", None))
        await self.server.close()

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(wandb_metrics or {})
        for name, values in self.signal_values.items():
            metrics[f"vf/{name}"] = sum(values) / len(values)
        for cause, count in self.failures.items():
            metrics[f"vf/dropped_groups/{cause}"] = float(count)
        self.signal_values.clear()
        await super().wandb_log(metrics)
