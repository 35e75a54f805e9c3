"""An OpenEnv environment server as a ``BaseEnv``: the model plays its episodes.

The adapter connects to a running server (``--env.openenv_url``) or starts one from a local
command (``--env.openenv_command "python -m my_env.server.app --port {port}"``) and plays
each episode over one WebSocket session with openenv-core's ``GenericEnvClient``: ``reset``
(the item's seed), then model reply -> ``step`` -> observation, until ``done`` or
``max_turns``. Observations become user messages; a reply becomes the action (its text in
``action_field``, or, with ``action_field: ""``, the JSON object it contains). Each episode is
one token-exact multi-turn sequence whose score is the episode's reward (the sum of step
rewards, or the last one). All ``group_size`` episodes of an item share its seed.

An action the server rejects as invalid is the model's fault: the episode ends with
``invalid_action_reward``. A server that fails (an exception in its step, a dropped session)
is the environment's fault: the group is dropped and counted by cause, never posted
half-scored; an inference failure is dropped, counted and the item retried later.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field

from atroposlib.envs.adapters import local_defaults, stop
from atroposlib.envs.adapters.openenv_server import LocalServer, hold
from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.trajectory import Trajectory
from atroposlib.errors import (
    ConfigError,
    ContextFullError,
    InferenceUnavailableError,
    ModelOutputError,
)
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item, Message
from atroposlib.utils.bounded_json import loads_model_output
from atroposlib.utils.health import NotHealthyError, wait_healthy_async

logger = logging.getLogger(__name__)

HIDDEN_FIELDS = ("done", "reward", "metadata")


class OpenEnvConfig(BaseEnvConfig):
    openenv_url: str | None = Field(default=None, description="URL of a running OpenEnv server.")
    openenv_command: str | None = Field(
        default=None, description="Command that starts a local server; {port} is filled in."
    )
    openenv_startup_timeout: float = Field(default=120.0, gt=0, description="Seconds to start.")
    action_field: str = Field(
        default="message", description="Action field the reply text fills ('' = reply is JSON)."
    )
    observation_fields: list[str] = Field(
        default_factory=list, description="Observation fields shown to the model (default: all)."
    )
    system_prompt: str = Field(default="", description="System message of every episode.")
    reset_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments of reset()."
    )
    max_turns: int = Field(default=8, ge=1, description="Model turns per episode.")
    episode_reward: Literal["sum", "last"] = Field(
        default="sum", description="Episode score: the sum of step rewards, or the last one."
    )
    invalid_action_reward: float = Field(default=-1.0, description="Score of a rejected action.")
    max_completion_tokens: int = Field(default=256, ge=1, description="Tokens per model turn.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature.")
    seed: int = Field(default=0, description="Seed of the per-item episode seeds.")
    step_timeout: float = Field(default=60.0, gt=0, description="Seconds a reset/step may take.")
    eval_size: int = Field(default=16, ge=1, description="Greedy episodes evaluate() plays.")


class InvalidActionError(Exception):
    """The reply cannot be an action of this environment (the model's fault)."""


def render_observation(observation: dict[str, Any], fields: list[str]) -> str:
    """What the model reads of an observation.

    >>> render_observation({"prompt": "Guess a number."}, [])
    'Guess a number.'
    >>> render_observation({"board": [1, 2], "turn": "x"}, [])
    'board: [1, 2]\\nturn: x'
    """
    shown = {
        key: value
        for key, value in observation.items()
        if (key in fields if fields else key not in HIDDEN_FIELDS)
    }
    if len(shown) == 1 and isinstance(next(iter(shown.values())), str):
        return str(next(iter(shown.values())))
    return "\n".join(
        f"{key}: {value if isinstance(value, str) else json.dumps(value)}"
        for key, value in shown.items()
    )


def reply_to_action(reply: str, action_field: str) -> dict[str, Any]:
    """The action a reply stands for.

    >>> reply_to_action("hello", "message")
    {'message': 'hello'}
    >>> reply_to_action('I pick {"move": 3}', "")
    {'move': 3}
    """
    if action_field:
        return {action_field: reply}
    start, end = reply.find("{"), reply.rfind("}")
    try:
        action = loads_model_output(reply[start : end + 1]) if start != -1 < end else None
    except ModelOutputError:
        action = None
    if not isinstance(action, dict):
        raise InvalidActionError("the reply holds no JSON object")
    return action


class OpenEnvEnv(BaseEnv):
    name = "openenv"
    env_config_cls = OpenEnvConfig
    config: OpenEnvConfig

    @classmethod
    def config_init(cls) -> tuple[OpenEnvConfig, list[APIServerConfig]]:
        return local_defaults(OpenEnvConfig)

    async def setup(self) -> None:
        config = self.config
        if (config.openenv_url is None) == (config.openenv_command is None):
            raise ConfigError("set exactly one of --env.openenv_url and --env.openenv_command")
        if not any(server.supports_token_ids for server in self.server.servers):
            raise ConfigError("OpenEnv episodes sample token ids: set server_type to embedded, "
                              "sglang or vllm")  # fmt: skip
        if config.openenv_command is not None:
            local = LocalServer(config.openenv_command, Path("logs") / "openenv-server.log")
            await local.start(config.openenv_startup_timeout)
            self._server_task = asyncio.create_task(hold(local), name="openenv-server")
            self.url = local.url
        else:
            self.url = str(config.openenv_url).rstrip("/")
            try:
                await wait_healthy_async(f"{self.url}/health", name="the OpenEnv server",
                                         timeout_s=config.openenv_startup_timeout)  # fmt: skip
            except NotHealthyError as exc:
                raise ConfigError(f"{exc}; check --env.openenv_url") from exc
        await self._check_action_field()
        self.sampler = self.token_sampler(max_token_length=config.max_token_length)
        self.greedy_sampler = self.token_sampler(
            temperature=0.0, max_token_length=config.max_token_length, split="eval"
        )
        self.rng = random.Random(config.seed)
        self.failures: Counter[str] = Counter()

    async def _check_action_field(self) -> None:
        async with httpx.AsyncClient(timeout=10.0) as http:
            answer = await http.get(f"{self.url}/schema")
        if answer.status_code != 200 or not self.config.action_field:
            return
        fields = answer.json().get("action", {}).get("properties", {})
        if self.config.action_field not in fields:
            raise ConfigError(
                f"--env.action_field {self.config.action_field!r} is not a field of the "
                f"server's action; it has {sorted(f for f in fields if f != 'metadata')}"
            )

    async def get_next_item(self) -> Item:
        return {"seed": self.rng.randrange(2**31)}

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        runs = [self.episode(item["seed"]) for _ in range(self.config.group_size)]
        results = await asyncio.gather(*runs, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                cause = failure_cause(result)
                self.failures[cause] += 1
                logger.warning("OpenEnv group dropped (%s): %s", cause, result)
                if isinstance(result, InferenceUnavailableError):
                    raise result
                return None, []
        episodes = [r for r in results if not isinstance(r, BaseException)]
        trajectories = [trajectory for trajectory, _, _ in episodes]
        scores = [score for _, score, _ in episodes]
        extra = [{"openenv_steps": steps, "openenv_seed": item["seed"]} for *_, steps in episodes]
        return self.sampler.group(trajectories, scores, extra=extra), []

    async def episode(self, seed: int, *, greedy: bool = False) -> tuple[Trajectory, float, int]:
        """One episode from ``reset(seed)``: its token trajectory, score and step count."""
        from openenv.core.generic_client import GenericEnvClient

        config = self.config
        sampler = self.greedy_sampler if greedy else self.sampler
        rewards: list[float] = []
        client = GenericEnvClient(base_url=self.url, message_timeout_s=config.step_timeout)
        async with client as env:
            result = await env.reset(seed=seed, **config.reset_args)
            first = [self._user(result.observation)]
            if config.system_prompt:
                first.insert(0, {"role": "system", "content": config.system_prompt})
            trajectory = sampler.start(first)
            while not result.done and trajectory.turns < config.max_turns:
                try:
                    [trajectory] = await sampler.sample(trajectory)
                    while trajectory.finish_reason == "abort":  # continue the same reply
                        [trajectory] = await sampler.sample(trajectory)
                except ContextFullError:
                    break
                try:
                    result = await env.step(reply_to_action(trajectory.reply, config.action_field))
                except (InvalidActionError, RuntimeError) as exc:
                    if isinstance(exc, RuntimeError) and "VALIDATION_ERROR" not in str(exc):
                        raise
                    return trajectory, config.invalid_action_reward, trajectory.turns
                rewards.append(float(result.reward or 0.0))
                if not result.done and trajectory.turns < config.max_turns:
                    trajectory = sampler.add_messages(trajectory, [self._user(result.observation)])
        score = sum(rewards) if config.episode_reward == "sum" else (rewards or [0.0])[-1]
        return trajectory, score, len(rewards)

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        """``eval_size`` greedy episodes from seeds of their own; failed ones are counted."""
        started = time.time()
        seeds = [random.Random(self.config.seed + 1).randrange(2**31) + i
                 for i in range(self.config.eval_size)]  # fmt: skip
        runs = [self.episode(seed, greedy=True) for seed in seeds]
        results = await asyncio.gather(*runs, return_exceptions=True)
        samples: list[dict[str, Any]] = [
            {"seed": seed, "response": result[0].reply, "score": result[1],
             "steps": result[2]}
            for seed, result in zip(seeds, results, strict=True)
            if not isinstance(result, BaseException)
        ]  # fmt: skip
        metrics = {"eval/failed": float(len(results) - len(samples))}
        if samples:
            metrics["eval/reward"] = sum(s["score"] for s in samples) / len(samples)
        await self.evaluate_log(metrics, samples=samples, start_time=started, end_time=time.time())

    def _user(self, observation: dict[str, Any]) -> Message:
        text = render_observation(observation, self.config.observation_fields)
        return {"role": "user", "content": text}

    async def close(self) -> None:
        """Stop the OpenEnv server this env started (if any) and close the inference servers."""
        await stop(getattr(self, "_server_task", None))
        await self.server.close()

    async def wandb_log(self, wandb_metrics: dict[str, Any] | None = None) -> None:
        metrics = dict(wandb_metrics or {})
        for cause, count in self.failures.items():
            metrics[f"openenv/dropped_groups/{cause}"] = float(count)
        await super().wandb_log(metrics)


def failure_cause(error: BaseException) -> str:
    """The counter a failed episode is filed under."""
    if isinstance(error, InferenceUnavailableError):
        return "inference"
    if isinstance(error, RuntimeError) and "code:" in str(error):
        return "server_error/" + str(error).rsplit("code:", 1)[1].strip(" )")
    if isinstance(error, ConnectionError | OSError | TimeoutError):
        return "server_unreachable"
    if type(error).__name__.startswith("ConnectionClosed"):  # websockets: the session dropped
        return "server_gone"
    return f"error/{type(error).__name__}"
