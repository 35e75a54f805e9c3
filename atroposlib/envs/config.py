"""``BaseEnvConfig``: every setting an environment shares, with Atropos 0.4's names and defaults."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field, SecretStr, field_validator


class EvalHandlingEnum(Enum):
    """What training rollouts do while ``evaluate()`` runs."""

    STOP_TRAIN = "STOP_TRAIN"
    """Training workers are stopped (their items go back to the backlog) until the eval ends."""
    LIMIT_TRAIN = "LIMIT_TRAIN"
    """Training keeps ``eval_limit_ratio`` of its workers during the eval."""
    NONE = "NONE"
    """Training runs at full speed beside the eval."""


class BaseEnvConfig(BaseModel):
    """Settings shared by every environment; subclass it to add your own fields."""

    group_size: int = Field(default=4, ge=1, description="Responses generated and scored together.")
    max_num_workers: int = Field(
        default=-1,
        description="Concurrent rollouts; -1 means max_num_workers_per_node x number of servers.",
    )
    max_eval_workers: int = Field(default=16, ge=1, description="Concurrent evaluation tasks.")
    max_num_workers_per_node: int = Field(
        default=8, ge=1, description="Workers per inference server when max_num_workers is -1."
    )
    steps_per_eval: int = Field(
        default=100, description="Run evaluate() every this many trainer steps (<= 0: never)."
    )
    max_token_length: int = Field(
        default=2048, ge=1, description="Longest sequence (prompt + completion) in tokens."
    )
    eval_handling: EvalHandlingEnum = Field(
        default=EvalHandlingEnum.STOP_TRAIN,
        description="Training during evals: STOP_TRAIN, LIMIT_TRAIN or NONE.",
    )
    eval_limit_ratio: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Share of training workers kept during an eval with LIMIT_TRAIN.",
    )
    inference_weight: float = Field(
        default=1.0,
        description="This env's share of inference and of each batch; -1 leaves it to the broker.",
    )
    batch_size: int = Field(
        default=-1, description="Trainer batch size in sequences; -1 takes it from the broker."
    )
    max_batches_offpolicy: int = Field(
        default=3, description="Pause generation once this many batches wait in the broker."
    )
    tokenizer_name: str = Field(
        default="NousResearch/DeepHermes-3-Llama-3-3B-Preview",
        description="Hugging Face tokenizer name or local folder.",
    )
    check_tokenizer: bool = Field(
        default=True,
        description="At start-up, refuse to run when tokenizer_name's ids for a probe text "
        "differ from the served model's (servers of type vllm, sglang, embedded).",
    )
    use_wandb: bool = Field(default=True, description="Log metrics to Weights & Biases.")
    rollout_server_url: str = Field(
        default="http://localhost:8000", description="URL of the broker (run-api)."
    )
    rollout_server_api_key: SecretStr | None = Field(
        default=None,
        description="Bearer token of a broker started with --api-key (default: the "
        "ATROPOS_API_KEY variable); never logged.",
    )
    total_steps: int = Field(
        default=1000,
        description="Stop at this trainer step (-1: the broker's num_steps); groups in process.",
    )
    wandb_name: str | None = Field(
        default=None, description="Name this env registers under (default: the class's name)."
    )
    num_rollouts_to_keep: int = Field(
        default=32, ge=0, description="Rollouts kept for the wandb rollouts table."
    )
    num_rollouts_per_group_for_logging: int = Field(
        default=1, description="Rollouts per group kept for logging; -1 keeps the whole group."
    )
    ensure_scores_are_not_same: bool = Field(
        default=True, description="Drop groups whose scores are all equal (no learning signal)."
    )
    data_path_to_save_groups: str | None = Field(
        default=None, description="Also append every group sent to this JSONL file."
    )
    data_dir_to_save_evals: str | None = Field(
        default=None, description="Directory for evaluation results (metrics.json, samples)."
    )
    min_items_sent_before_logging: int = Field(
        default=2, description="Groups to send in a step before logging (<= 0: log every step)."
    )
    include_messages: bool = Field(
        default=False, description="Send the chat messages of each rollout with the group."
    )
    min_batch_allocation: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Minimum share (0-1) of every batch reserved for this env.",
    )
    worker_timeout: float = Field(
        default=600, description="Seconds before a rollout is cancelled (-1: no limit)."
    )
    process_max_attempts_without_group: int = Field(
        default=1000,
        description="process: stop after this many rollouts in a row wrote no group (-1: never).",
    )
    process_max_minutes_without_group: float = Field(
        default=-1,
        description="process: stop after this many minutes without a written group (-1: never).",
    )

    thinking_mode: bool = Field(
        default=False,
        description="Ask reasoning models to think (reasoning options in each chat request).",
    )
    reasoning_effort: str | None = Field(
        default=None,
        description="Reasoning effort: none, minimal, low, medium, high or xhigh (turns on "
        "thinking_mode).",
    )
    max_reasoning_tokens: int | None = Field(
        default=None,
        ge=1024,
        le=32000,
        description="Reasoning token budget, 1024-32000 (not for OpenAI's own API).",
    )
    custom_thinking_prompt: str | None = Field(
        default=None, description="System prompt envs may prepend in thinking mode."
    )

    @field_validator("reasoning_effort")
    @classmethod
    def _known_effort(cls, value: str | None) -> str | None:
        from atroposlib.envs.server_handling.reasoning import VALID_REASONING_EFFORTS

        if value is not None and value not in VALID_REASONING_EFFORTS:
            raise ValueError(f"must be one of {sorted(VALID_REASONING_EFFORTS)}")
        return value

    @field_validator("process_max_attempts_without_group", "process_max_minutes_without_group")
    @classmethod
    def _budget_is_positive_or_unlimited(cls, value: float) -> float:
        if value <= 0 and value != -1:
            raise ValueError("must be > 0, or -1 to never stop")
        return value

    @field_validator("inference_weight")
    @classmethod
    def _weight_is_positive_or_ignored(cls, value: float) -> float:
        if value <= 0 and value != -1:
            raise ValueError("must be > 0, or -1 to let the broker decide")
        return value
