"""Loading a verifiers environment for the adapter: config, model context, serving lifetime."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import Field

from atroposlib.envs.adapters import vf_client, vf_harness
from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.rollouts import TokenSampler, TokenServer
from atroposlib.errors import ConfigError

LOCAL_RUNTIME = {"type": "subprocess"}


class VerifiersEnvConfig(BaseEnvConfig):
    vf_env: str = Field(
        default="", description="verifiers environment: its taskset id (package or module name)."
    )
    vf_args: dict[str, Any] = Field(
        default_factory=dict, description="The environment's taskset settings (JSON object)."
    )
    vf_eval_args: dict[str, Any] | None = Field(
        default=None, description="Taskset settings for evaluate() (default: vf_args)."
    )
    vf_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Other verifiers env settings: id (user-sim...), seats (agent.max_turns...).",
    )
    max_completion_tokens: int = Field(default=512, ge=1, description="Tokens per model turn.")
    temperature: float = Field(default=1.0, ge=0.0, description="Sampling temperature.")
    eval_size: int = Field(default=64, ge=1, description="Eval tasks that evaluate() runs.")
    shuffle_seed: int = Field(default=0, description="Seed that orders a finite taskset.")


def env_config(config: VerifiersEnvConfig, taskset_args: dict[str, Any]) -> Any:
    """verifiers' env config: our seat defaults (in-process harness, local runtime) under
    whatever ``vf_config`` pins, the taskset id and its settings."""
    import verifiers.v1 as vf

    raw: dict[str, Any] = {key: value for key, value in config.vf_config.items()}
    raw["taskset"] = {**(raw.get("taskset") or {}), **taskset_args, "id": config.vf_env}
    try:
        config_cls = vf.env_config_type(config.vf_env, str(raw.get("id") or ""))
    except (ModuleNotFoundError, TypeError, AttributeError, ValueError) as exc:
        raise ConfigError(f"cannot load verifiers environment {config.vf_env!r}: {exc}") from exc
    for name, field in config_cls.model_fields.items():
        if not isinstance(field.default, vf.AgentConfig):
            continue
        seat = dict(raw.get(name) or {})
        if field.default.harness is None:
            seat.setdefault("harness", {"id": vf_harness.HARNESS_ID})
        if field.default.runtime.type == "prime":
            seat.setdefault("runtime", LOCAL_RUNTIME)
        raw[name] = seat
    try:
        return vf.resolve_env_config(raw)
    except (ModuleNotFoundError, TypeError, AttributeError) as exc:
        raise ConfigError(f"cannot load verifiers environment {config.vf_env!r}: {exc}") from exc
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ConfigError(f"--env.vf_args / --env.vf_config: {exc}") from exc


def load(config: VerifiersEnvConfig, taskset_args: dict[str, Any]) -> Any:
    """The verifiers ``Env``, with our client and harness made resolvable."""
    import verifiers.v1 as vf

    vf_client.install()
    vf_harness.register()
    settings = env_config(config, taskset_args)
    try:
        return vf.load_environment(settings)
    except (ModuleNotFoundError, TypeError, AttributeError) as exc:
        raise ConfigError(f"cannot load verifiers environment {config.vf_env!r}: {exc}") from exc


def load_taskset(config: VerifiersEnvConfig, taskset_args: dict[str, Any]) -> Any:
    import verifiers.v1 as vf

    return vf.load_taskset(env_config(config, taskset_args).taskset)


def model_context(
    config: VerifiersEnvConfig, server: TokenServer, tokenizer: Any, model: str, *, split: str
) -> Any:
    """The rollout context: our client (a route to a sampler on ``server``) and the sampling
    settings; evaluation samples greedily on the servers' eval capacity."""
    import verifiers.v1 as vf

    temperature = config.temperature if split == "train" else 0.0
    sampler = TokenSampler(
        server,
        tokenizer,
        max_tokens=config.max_completion_tokens,
        temperature=temperature,
        max_token_length=config.max_token_length,
        split=split,
    )
    key = vf_client.register_route(vf_client.TokenRoute(sampler=sampler))
    return vf.ModelContext(
        model=model,
        client=vf_client.AtroposClientConfig(route=key),
        sampling=vf.SamplingConfig(
            temperature=temperature, max_tokens=config.max_completion_tokens
        ),
    )


async def hold_serving(vf_env: Any) -> asyncio.Task[None]:
    """Enter ``vf_env.serving()`` (interception, shared tool servers) in a task that holds it
    until cancelled: at the end of the run, ``asyncio.run`` cancels it and it tears down."""
    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def hold() -> None:
        try:
            async with vf_env.serving():
                ready.set_result(None)
                await asyncio.Event().wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    task = asyncio.create_task(hold(), name="verifiers-serving")
    await ready
    return task
