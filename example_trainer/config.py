"""TrainerConfig: every knob of the GRPO trainer, declared once.

Precedence: command line > environment (``ATROPOS_TRAINER_``, nested with ``__``) > YAML
(``--config run.yaml``) > defaults. Flags are ``--kebab-case`` (``--broker-url``,
``--loss.clip-eps-low``); the old ``--snake_case`` spellings still work for one release, with a
deprecation line. YAML keys and variables keep the field names (``broker_url:``).
``load_config(argv)`` is the one entry point; it raises ``ConfigError`` with a one-line reason
for a bad flag or an invariant that does not hold.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import SettingsConfigDict, SettingsError

from atroposlib.errors import ConfigError
from atroposlib.utils.cli import accept_snake_case, describe, model_flags, settings_cli_source
from atroposlib.utils.yaml_settings import (
    LayeredSettings,
    config_flag,
    read_yaml_config,
    yaml_layer,
)

FULL_SYNC = ("disk", "vllm_restart", "embedded", "vllm", "sglang")
LIVE_SYNC = {
    "embedded": ("http", "shm"),
    "vllm": ("nccl", "ipc", "shm", "disk"),
    "sglang": ("distributed", "disk"),
}
"""The engines' native in-flight APIs and their transports (the first is ``auto``'s)."""


class LossConfig(BaseModel):
    """GRPO loss variants; each is a switch (see example_trainer/README.md for the papers)."""

    model_config = ConfigDict(extra="forbid")

    advantage_baseline: Literal["group_mean", "leave_one_out"] = Field(
        "group_mean", description="Baseline subtracted from a score: group mean or RLOO."
    )
    advantage_std: Literal["group", "batch", "none"] = Field(
        "group", description="Divide advantages by the group / batch score std, or not (Dr GRPO)."
    )
    std_eps: float = Field(1e-4, gt=0, description="Added to the std before dividing.")
    role_baseline: bool = Field(
        False, description="SPIRAL: per-(env, role) running-mean baselines for self-play."
    )
    role_baseline_decay: float = Field(
        0.95, ge=0, lt=1, description="EMA decay of the SPIRAL role baselines."
    )
    aggregation: Literal["token_mean", "seq_mean_token_mean", "constant"] = Field(
        "token_mean",
        description="token_mean over the batch (DAPO), per-sequence token mean (GRPO), or a "
        "constant normaliser (Dr GRPO).",
    )
    constant_normalizer: int | None = Field(
        None,
        gt=0,
        description="Tokens per sequence for aggregation=constant (default max_token_len).",
    )
    ratio: Literal["token", "sequence"] = Field(
        "token", description="token: PPO ratio per token; sequence: GSPO length-normalised ratio."
    )
    clip_eps_low: float = Field(0.2, ge=0, lt=1, description="Lower clip: ratio >= 1 - eps_low.")
    clip_eps_high: float = Field(
        0.2, ge=0, description="Upper clip: ratio <= 1 + eps_high (DAPO clip-higher: 0.28)."
    )
    behavior_logprobs: Literal["trainer", "inference"] = Field(
        "trainer",
        description="Old policy of the ratio: the trainer's logprobs at the start of the step, "
        "or the batch's inference_logprobs.",
    )
    is_correction: Literal["none", "tis", "mask"] = Field(
        "none",
        description="Off-policy correction vs inference_logprobs: truncated importance "
        "weights (tis) or masking tokens whose ratio is out of bounds (mask).",
    )
    is_cap: float = Field(2.0, gt=0, description="TIS: importance weights are min(w, is_cap).")
    is_mask_low: float = Field(0.5, ge=0, description="mask: drop tokens with w < is_mask_low.")
    is_mask_high: float = Field(2.0, gt=0, description="mask: drop tokens with w > is_mask_high.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the KL penalty to the reference.")
    kl_estimator: Literal["k1", "k3"] = Field("k3", description="KL estimator (Schulman's k1/k3).")
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
    mask_zero_variance_groups: bool = Field(
        True, description="Leave groups whose scores are all equal out of the loss (DAPO)."
    )
    mask_truncated: bool = Field(
        False,
        description="Leave truncated completions (override truncated=true or "
        "finish_reason=length) out of the loss (DAPO overlong filtering).",
    )

    distill_coef: float = Field(
        0.0,
        ge=0,
        description="On-policy distillation: weight of the per-token reverse KL to the teacher's "
        "top-k distribution (groups' distill_token_ids/distill_logprobs), added to the loss.",
    )
    distill_only: bool = Field(
        False, description="Train on the distillation loss alone (no GRPO term)."
    )

    @model_validator(mode="after")
    def _check(self) -> LossConfig:
        if self.is_mask_low >= self.is_mask_high:
            raise ValueError("loss.is_mask_low must be below loss.is_mask_high; widen the bounds")
        if self.distill_only and self.distill_coef <= 0:
            raise ValueError("loss.distill_only needs loss.distill_coef > 0; set the weight too")
        return self


class LoraConfig(BaseModel):
    """LoRA through peft; the base model stays frozen."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Train LoRA adapters instead of all weights.")
    r: int = Field(16, gt=0, description="LoRA rank.")
    alpha: int = Field(32, gt=0, description="LoRA alpha (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Module names that get adapters.",
    )
    adapter_name: str = Field(
        "atropos", description="Name the inference servers know the hot-loaded adapter by."
    )


class WandbConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Log metrics to Weights & Biases.")
    project: str = Field("atroposlib", description="wandb project (also sent to the broker).")
    group: str | None = Field(None, description="wandb group (also sent to the broker).")
    name: str | None = Field(None, description="wandb run name.")


def _shared_admin_key() -> SecretStr | None:
    """The run's admin key (``ATROPOS_ADMIN_API_KEY``), else its run key (``ATROPOS_API_KEY``):
    every call the trainer makes is an admin one (registering, batches, weight pushes), and a
    server without an admin key takes its run key for those routes."""
    key = os.environ.get("ATROPOS_ADMIN_API_KEY") or os.environ.get("ATROPOS_API_KEY")
    return SecretStr(key) if key else None


class TrainerConfig(LayeredSettings):
    """GRPO trainer for atroposlib: pulls scored groups from the broker and trains on them."""

    model_config = SettingsConfigDict(
        env_prefix="ATROPOS_TRAINER_",
        env_nested_delimiter="__",
        cli_prog_name="atropos-grpo",
        cli_implicit_flags=True,
        cli_kebab_case=True,
        extra="forbid",
    )

    config: Path | None = Field(None, description="YAML file with any of these settings.")
    model: str = Field(
        "HuggingFaceTB/SmolLM2-135M-Instruct", description="HF model name or folder to train."
    )
    ref_model: str | None = Field(
        None, description="Frozen reference model for the KL (default: the starting model)."
    )
    broker_url: str = Field("http://localhost:8000", description="atroposlib broker base URL.")
    broker_api_key: SecretStr | None = Field(
        default_factory=_shared_admin_key,
        description="Bearer token for the broker's trainer routes (/register, /batch, /ack: "
        "run-api's --admin-api-key when set, else its --api-key). Default: "
        "ATROPOS_ADMIN_API_KEY, else ATROPOS_API_KEY (atropos-local and the sbatch script set "
        "both; only the trainer gets the admin key).",
    )
    broker_patience_s: float = Field(
        600.0, ge=0, description="How long to wait out a broker outage before giving up."
    )
    batch_size: int = Field(32, gt=0, description="Sequences per optimizer step.")
    max_token_len: int = Field(2048, gt=1, description="Longest sequence the trainer accepts.")
    micro_batch_tokens: int = Field(
        8192,
        gt=0,
        description="Tokens per micro-batch (forward/backward unit): rows x longest row, "
        "packed or bucketed.",
    )
    micro_batching: Literal["packed", "prefix_shared", "bucketed"] = Field(
        "packed",
        description="packed: whole sequences back to back in rows (block-diagonal "
        "attention, almost no padding); prefix_shared: packed, but sequences sharing a prompt "
        "(a group's replies) compute it once, for groups with long prompts; bucketed: one "
        "sequence per row, rows of similar length padded to the longest.",
    )
    pack_row_tokens: int | None = Field(
        None,
        gt=0,
        description="packed, prefix_shared: tokens per row (default: the power of two >= the "
        "batch's longest sequence, at most max_token_len, or longest tree of a shared prompt "
        "and its replies; at most micro_batch_tokens); the attention cost grows with its "
        "square; rows share a micro-batch.",
    )
    trained_logits_only: bool = Field(
        True,
        description="packed: compute the vocabulary projection and log-softmax only at "
        "trained positions (prompts never are); the loss is the same. prefix_shared needs it.",
    )
    lr: float = Field(1e-6, gt=0, description="Peak learning rate (AdamW).")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Decay after warmup."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps.")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="Final lr / peak lr for decays.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    num_steps: int = Field(100, gt=0, description="Optimizer steps to run.")
    time_limit_s: float | None = Field(
        None,
        gt=0,
        description="Stop after the step during which this many seconds have passed since the "
        "trainer started (model loading included); that step is saved and pushed as the last.",
    )
    seed: int = Field(0, description="Seed for torch, numpy and random.")
    save_dir: Path = Field(Path("checkpoints"), description="Where checkpoints are written.")
    save_interval: int = Field(10, gt=0, description="Save (and acknowledge) every N steps.")
    keep_last_checkpoints: int | None = Field(
        None,
        ge=1,
        description="Checkpoints (save_dir/step-N) kept: older ones are deleted after each save "
        "(default: keep every one). A full-weight checkpoint is the weights plus twice their "
        "size in AdamW state.",
    )
    checkpoint_optimizer_precision: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="Precision of the optimizer state written into checkpoints; bf16 halves it "
        "(a resumed run continues from moments rounded to bf16, 3 significant digits).",
    )
    metrics_file: Path | None = Field(
        None, description="Append every step's metrics as one JSON line here (rank 0)."
    )
    resume: str | None = Field(
        None, description="Checkpoint folder to continue from, or 'auto' for the latest."
    )
    max_staleness: int | None = Field(
        None, ge=0, description="Ask the broker to drop groups older than N steps."
    )
    weight_sync: Literal["none", "disk", "vllm_restart", "lora", "embedded", "vllm", "sglang"] = (
        Field(
            "none",
            description="How inference servers get new weights: reload from disk, restart vLLM, "
            "hot-load a LoRA adapter, or the engine's native in-flight update (embedded, vllm, "
            "sglang: weights reach the servers while requests are in flight).",
        )
    )
    sync_transport: Literal["auto", "http", "shm", "nccl", "ipc", "disk", "distributed"] = Field(
        "auto",
        description="In-flight transport: embedded http|shm, vllm nccl|ipc|shm|disk, sglang "
        "distributed|disk (auto: the first of each).",
    )
    sync_pause: Literal["keep", "wait", "abort"] = Field(
        "keep",
        description="In-flight pause mode: keep (requests freeze and continue on the new "
        "weights), wait (they finish first), abort (they end; envs resubmit them token-in).",
    )
    sync_chunk_mb: int = Field(32, gt=0, description="In-flight transfer chunk size (MiB).")
    sync_verify: Literal["version", "checksum"] = Field(
        "version",
        description="After each in-flight sync, read every server's weight version back; "
        "checksum: also compare weight checksums (embedded, vllm).",
    )
    sync_recompute_kv: bool = Field(
        False,
        description="keep mode: requests in flight recompute their KV cache under the new "
        "weights (vLLM reset_running_requests, SGLang retract) instead of keeping it. Without "
        "it, vLLM cannot reset its prefix cache while they hold blocks: a new request starting "
        "with a cached prefix reuses keys/values of the earlier weights (warned once).",
    )
    sync_master_address: str = Field(
        "127.0.0.1", description="nccl/distributed: address of the trainer's rendezvous."
    )
    sync_master_port: int = Field(
        29600, ge=1, le=65535, description="nccl/distributed: port of the trainer's rendezvous."
    )
    inference_urls: list[str] = Field(
        default_factory=list, description="Inference servers to update (base URLs)."
    )
    inference_api_key: SecretStr | None = Field(
        default_factory=_shared_admin_key,
        description="Bearer token for the inference servers' weight, pause and LoRA routes "
        "(their --admin-api-key or ATROPOS_ADMIN_API_KEY when set, else their --api-key). "
        "Default: ATROPOS_ADMIN_API_KEY, else ATROPOS_API_KEY (atropos-local and the sbatch "
        "script set both; only the trainer gets the admin key).",
    )
    sync_interval: int = Field(1, gt=0, description="Push weights every N steps.")
    keep_last_weights: int = Field(
        2,
        ge=1,
        description="Pushed weight folders (save_dir/weights/step-N) kept: older ones are "
        "deleted after each push. The last one holds the final weights.",
    )
    sync_retries: int = Field(3, ge=0, description="Retries per server for a failed weight push.")
    sync_timeout: float = Field(300.0, gt=0, description="Seconds per weight-push request.")
    vllm_command: str = Field(
        "python -m vllm.entrypoints.openai.api_server --model {model} --host 127.0.0.1 "
        "--port {port} --enable-scale-out --middleware atroposlib.vllm_plugin.guard.VllmGuard",
        description="vllm_restart: command that serves {model} on {port}. The default listens "
        "on loopback behind our guard, which takes the keys from the trainer's environment "
        "(ATROPOS_API_KEY, ATROPOS_ADMIN_API_KEY), never from the command line; on another "
        "--host it serves other machines only with ATROPOS_API_KEY set.",
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward.")
    precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto", description="auto: bf16 autocast on GPUs that support it, else fp32."
    )
    fp32_logits: bool = Field(
        False,
        description="bf16: compute the output projection (the logits) in fp32 (bf16 rounds "
        "logits of 10-30 by up to 0.06). An H200 run of scripts/gpu-check: +6 % step time on a "
        "1.5B-like model; docs/engines.md has what it changes.",
    )
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="Multi-process strategy under torchrun: DDP or FSDP2 (gloo on CPU)."
    )
    loss: LossConfig = Field(default_factory=LossConfig, description="Loss options.")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA options.")
    wandb: WandbConfig = Field(default_factory=WandbConfig, description="wandb options.")

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.weight_sync == "lora" and not self.lora.enabled:
            raise ValueError(
                "weight_sync=lora hot-loads an adapter, but lora.enabled is false; "
                "set --lora.enabled or choose --weight-sync disk"
            )
        transports = LIVE_SYNC.get(self.weight_sync)
        if transports is None and self.sync_transport != "auto":
            raise ValueError(
                f"sync_transport={self.sync_transport} is for the in-flight syncs; set "
                "--weight-sync embedded, vllm or sglang, or leave --sync-transport auto"
            )
        if transports is not None and self.sync_transport not in ("auto", *transports):
            raise ValueError(
                f"weight_sync={self.weight_sync} has no transport {self.sync_transport}; "
                f"choose --sync-transport from {', '.join(transports)}"
            )
        if self.weight_sync != "none" and not self.inference_urls:
            raise ValueError(
                f"weight_sync={self.weight_sync} needs servers to update; set "
                "--inference-urls '[\"http://host:port\"]' or --weight-sync none"
            )
        if self.micro_batch_tokens < self.max_token_len:
            raise ValueError(
                f"micro_batch_tokens={self.micro_batch_tokens} is below max_token_len="
                f"{self.max_token_len}, so the longest sequence cannot fit a micro-batch; raise "
                "--micro-batch-tokens to at least max_token_len"
            )
        if self.loss.distill_coef > 0 and self.micro_batching != "bucketed":
            raise ValueError(
                "the distillation loss reads the student's whole vocabulary at each position, "
                f"which {self.micro_batching} micro-batches do not compute; set "
                "--micro-batching bucketed"
            )
        if self.micro_batching == "prefix_shared" and not self.trained_logits_only:
            raise ValueError(
                "prefix_shared computes logits only at trained positions (a shared prompt's "
                "last position serves every reply); leave --trained-logits-only on or set "
                "--micro-batching packed"
            )
        if self.warmup_steps >= self.num_steps and self.warmup_steps > 0:
            raise ValueError("warmup_steps must be below num_steps; lower --warmup-steps")
        if self.parallel == "fsdp" and self.lora.enabled and self.weight_sync in FULL_SYNC:
            raise ValueError(
                f"weight_sync={self.weight_sync} needs merged LoRA weights, which are not "
                "gathered from FSDP shards; use --parallel ddp or --weight-sync lora"
            )
        return self

    @property
    def constant_normalizer(self) -> int:
        return self.loss.constant_normalizer or self.max_token_len


def load_config(argv: list[str] | None = None, **overrides: Any) -> TrainerConfig:
    """Parse ``argv`` (never sys.argv implicitly) with env vars and ``--config`` YAML."""
    args = accept_snake_case("atropos-grpo", argv or [], model_flags(TrainerConfig))
    yaml_file = config_flag(args)
    try:
        with yaml_layer(read_yaml_config(yaml_file) if yaml_file else None):
            source = settings_cli_source(
                TrainerConfig, args, "atropos-grpo", cli_implicit_flags=True, cli_kebab_case=True
            )
            return TrainerConfig(_cli_settings_source=source, **overrides)
    except (ValidationError, SettingsError) as err:
        raise ConfigError(describe(err)) from err
