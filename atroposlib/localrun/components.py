"""The command lines of a local run's processes, all on loopback ports chosen at start.

Every process gets the run key from the supervisor; the broker, the inference server and the
trainer get the admin key in their own ``env`` (:mod:`atroposlib.localrun.keys`).
"""

from __future__ import annotations

import socket
import sys
from dataclasses import replace

from atroposlib.launcher import Component
from atroposlib.localrun.inference import INFERENCE
from atroposlib.localrun.keys import RunKeys
from atroposlib.localrun.layout import RunLayout
from atroposlib.localrun.settings import LocalRunSettings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def broker(layout: RunLayout, keys: RunKeys) -> Component:
    return Component(
        "broker",
        [sys.executable, "-m", "atroposlib.api", "--port", str(layout.broker_port),
         "--store", f"sqlite:{layout.run_dir / 'broker.sqlite3'}"],
        health_url=f"{layout.broker_url}/health",
        env=keys.admin_environment(),
    )  # fmt: skip


def inference(layout: RunLayout, settings: LocalRunSettings, keys: RunKeys) -> Component:
    server = INFERENCE[settings.inference].component(layout, settings)
    return replace(server, env={**server.env, **keys.admin_environment()})


def trainer(layout: RunLayout, settings: LocalRunSettings, keys: RunKeys) -> Component:
    return Component(
        "trainer",
        [sys.executable, "-m", "example_trainer.train",
         "--config", str(settings.trainer_config),
         "--model", layout.model,
         "--broker-url", layout.broker_url,
         "--batch-size", str(settings.batch_size),
         "--max-token-len", str(settings.max_token_len),
         "--num-steps", str(settings.steps),
         "--lr", str(settings.lr),
         "--seed", str(settings.seed),
         "--save-dir", str(layout.checkpoints),
         "--save-interval", str(max(1, settings.steps // 4)),
         "--keep-last-checkpoints", str(settings.keep_last_checkpoints),
         "--keep-last-weights", str(settings.keep_last_weights),
         "--checkpoint-optimizer-precision", settings.checkpoint_optimizer_precision,
         *INFERENCE[settings.inference].weight_sync_args(
             layout, keep_folders=settings.eval_every_steps > 0),
         "--metrics-file", str(layout.metrics_file),
         *(["--time-limit-s", str(settings.minutes * 60)] if settings.minutes else []),
         "--loss.behavior-logprobs", settings.behavior_logprobs,
         *settings.run_precision.trainer_args,
         *settings.trainer_args],
        env={"OMP_NUM_THREADS": str(settings.threads),
             **({"CUDA_VISIBLE_DEVICES": ""} if settings.device == "cpu" else {}),
             **keys.admin_environment()},
    )  # fmt: skip


def environment(layout: RunLayout, settings: LocalRunSettings, mode: str = "serve") -> Component:
    argv = [
        sys.executable, str(settings.env_script), mode,
        "--config", str(settings.env_config),
        "--openai.base_url", f"{layout.inference_url}/v1",
        "--openai.model_name", "default",
        "--openai.server_type", INFERENCE[settings.inference].server_type,
        "--env.tokenizer_name", layout.model,
        "--env.max_token_length", str(settings.max_token_len),
    ]  # fmt: skip
    if mode == "serve":
        argv += [
            "--env.rollout_server_url", layout.broker_url,
            "--env.group_size", str(settings.group_size),
            "--env.total_steps", str(settings.steps),
            "--env.data_path_to_save_groups", str(layout.rollouts_file),
            "--env.include_messages", "true",
            *settings.env_args,
        ]  # fmt: skip
    return Component(f"env-{mode}", argv)


def evaluation(layout: RunLayout, settings: LocalRunSettings, label: str) -> Component:
    """``env.py evaluate``: greedy answers to held-out problems, written to eval_<label>/."""
    component = environment(layout, settings, mode="evaluate")
    argv = [
        *component.argv,
        *settings.env_args,
        "--env.eval_size", str(settings.eval_size),
        "--env.data_dir_to_save_evals", str(layout.eval_dir(label)),
    ]  # fmt: skip
    return Component(f"eval-{label}", argv)
