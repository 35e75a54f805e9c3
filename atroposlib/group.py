"""The scored group: the one typed unit an environment sends, the broker checks, the trainer reads.

A group is G sequences of the same item with their scores. Field names and shapes are Atropos
0.4's (COMPAT); an Atropos env's plain dict validates into :class:`ScoredData` unchanged. Our
additions are optional and declared here:

- ``finish_reasons``: why each sequence's last sampled turn ended; ``"length"`` marks it
  truncated (the trainer's ``mask_truncated`` drops it).
- ``policy_versions`` / ``token_policy_versions``: the inference engine's weight version that
  sampled each sequence's oldest token / each token (``-1`` where nothing was sampled).
- ``extra``: one JSON object per sequence for env-specific metadata (nothing reads it but
  the env's own tools); ``overrides`` are what the trainer reads, with declared keys.

:class:`GroupMeta` is the group without its per-token arrays: the trainer validates that view
of each group it pulls, so the arrays (numpy there) are never copied into Python lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from atroposlib.bounds import MAX_STEP, SignedStep, Step

FinishReason = Literal["stop", "length", "abort", "tool_calls", "content_filter"]
"""Why sampling stopped, as vLLM, SGLang and OpenAI name it (``abort``: cut off by the engine)."""

MASK_IGNORE_INDEX = -100
"""``masks`` value on positions that are not trained (prompt tokens)."""

NOT_SAMPLED_VERSION = -1
"""``token_policy_versions`` value on positions no engine sampled (prompt, env messages)."""

PROMPT_LOGPROB = 1.0
"""``inference_logprobs`` placeholder on positions not sampled (Atropos's convention)."""


class Message(BaseModel):
    """One chat message; keys beyond ``role`` and ``content`` are kept."""

    model_config = ConfigDict(extra="allow")

    role: str
    content: Any


class SequenceOverrides(BaseModel):
    """Per-sequence switches the trainer reads; unknown keys are kept (Atropos allowed any)."""

    model_config = ConfigDict(extra="allow")

    set_advantage_to_zero: StrictBool | None = Field(
        default=None, description="Train this sequence with advantage 0 (kept for KL/entropy)."
    )
    temperature: StrictFloat | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Temperature it was sampled at."
    )
    sft: StrictBool | None = Field(default=None, description="Train with plain cross-entropy.")
    role: StrictStr | None = Field(
        default=None, description="Role in a multi-agent game (SPIRAL role baselines)."
    )
    truncated: StrictBool | None = Field(
        default=None, description="Cut off before it ended (also: finish_reasons 'length')."
    )


class GroupOverrides(BaseModel):
    """Group-wide switches; unknown keys are kept."""

    model_config = ConfigDict(extra="allow")

    group_size: StrictInt | None = Field(
        default=None, ge=1, description="This group's size when it differs from the registered."
    )
    temperature: StrictFloat | None = Field(default=None, gt=0, allow_inf_nan=False)
    sft: StrictBool | None = None
    screened: StrictBool | None = Field(
        default=None,
        description="Sampled in stages and stopped after its first replies agreed: the env "
        "drops it as all-equal (dumped, never sent).",
    )


_PER_SEQUENCE = ("messages", "overrides", "finish_reasons", "policy_versions", "extra")
_PER_TOKEN = ("masks", "advantages", "ref_logprobs", "inference_logprobs", "token_policy_versions")


class GroupMeta(BaseModel):
    """Everything of a group but its per-token arrays (which this view ignores)."""

    model_config = ConfigDict(extra="ignore")

    scores: list[Annotated[float, Field(allow_inf_nan=False)]] = Field(
        description="One finite score per sequence."
    )
    messages: list[list[Message]] | None = None
    generation_params: dict[str, Any] | None = None
    overrides: list[SequenceOverrides] | None = None
    group_overrides: GroupOverrides | None = None
    images: Any | None = None
    env_id: SignedStep | None = None
    group_id: str | None = Field(
        default=None,
        max_length=200,
        description="Idempotency key: a group posted twice with the same id is queued once.",
    )
    policy_version: Step | None = Field(
        default=None,
        description="Trainer step of the weights that generated this group.",
    )
    finish_reasons: list[FinishReason | None] | None = Field(
        default=None, description="Why each sequence's last sampled turn ended."
    )
    policy_versions: list[Annotated[StrictInt, Field(ge=0, le=MAX_STEP)] | None] | None = Field(
        default=None, description="Engine weight version of each sequence's oldest sampled token."
    )
    extra: list[dict[str, JsonValue]] | None = Field(
        default=None, description="Env-specific metadata, one JSON object per sequence."
    )

    @property
    def size(self) -> int:
        return len(self.scores)

    def truncated(self, index: int) -> bool:
        """Whether sequence ``index`` was cut off (finish reason ``length``, or the override)."""
        if self.finish_reasons is not None and self.finish_reasons[index] == "length":
            return True
        return bool(self.overrides is not None and self.overrides[index].truncated)

    def override(self, index: int, key: str, default: Any = None) -> Any:
        """A sequence override, else the group override of the same name, else ``default``."""
        own = getattr(self.overrides[index], key, None) if self.overrides is not None else None
        if own is not None:
            return own
        shared = getattr(self.group_overrides, key, None)
        return default if shared is None else shared

    @field_validator("messages", mode="before")
    @classmethod
    def _empty_messages_mean_none(cls, value: Any) -> Any:
        return None if value == [] else value  # Atropos's clients send [] for "no messages"

    @model_validator(mode="after")
    def _one_entry_per_sequence(self) -> Self:
        for name in _PER_SEQUENCE:
            values = getattr(self, name)
            if values is not None and len(values) != self.size:
                raise ValueError(
                    f"{name} has {len(values)} entries but the group has {self.size} scores; "
                    "send one per sequence"
                )
        return self


class ScoredData(GroupMeta):
    """One group: G sequences of the same prompt with their scores (``POST /scored_data``).

    ``masks`` has the shape of ``tokens``: ``-100`` where the position is not trained, the
    token id where it is. Per-token arrays (``advantages``, ``ref_logprobs``,
    ``inference_logprobs``, ``token_policy_versions``) are aligned with ``tokens``;
    ``inference_logprobs`` holds 1.0 on positions the engine did not sample.
    """

    model_config = ConfigDict(extra="ignore")

    tokens: list[list[int]]
    masks: list[list[int]]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    inference_logprobs: list[list[float]] | None = Field(
        default=None, description="The engine's logprob of each sampled token (Atropos name)."
    )
    token_policy_versions: list[list[int]] | None = Field(
        default=None, description="Engine weight version that sampled each token (-1: not)."
    )
    distill_token_ids: list[list[list[int]]] | None = None
    distill_logprobs: list[list[list[float]]] | None = None

    @model_validator(mode="after")
    def _aligned_with_tokens(self) -> Self:
        if len(self.tokens) != self.size:
            raise ValueError(
                f"tokens has {len(self.tokens)} sequences but scores has {self.size}; "
                "send one score per sequence"
            )
        for name in _PER_TOKEN:
            rows = getattr(self, name)
            if rows is None:
                continue
            if len(rows) != len(self.tokens):
                raise ValueError(f"{name} has {len(rows)} sequences, tokens has {len(self.tokens)}")
            for index, (row, seq) in enumerate(zip(rows, self.tokens, strict=True)):
                if len(row) != len(seq):
                    raise ValueError(
                        f"{name}[{index}] has {len(row)} values but tokens[{index}] has "
                        f"{len(seq)}; align it with tokens"
                    )
        return self

    @classmethod
    def from_atropos(cls, group: ScoredData | Mapping[str, Any]) -> ScoredData:
        """A group from an env: ours as it is, an Atropos-style dict validated once."""
        return group if isinstance(group, ScoredData) else cls.model_validate(group)

    def wire(self) -> dict[str, Any]:
        """The JSON form sent to the broker and written to ``process`` JSONL (nulls left out)."""
        return self.model_dump(mode="json", exclude_none=True)


def invalid_group_reason(error: ValidationError) -> str:
    """The first problem of a group that does not validate, as ``field: what is wrong``."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    return f"{field}: {message}" if field else message


def checked_wire_form(group: ScoredData | Mapping[str, Any]) -> tuple[ScoredData, dict[str, Any]]:
    """The typed group and the JSON form to send. A dict that validates is sent as it came
    (its declared keys, nulls left out), so an Atropos env's group costs one validation."""
    if isinstance(group, ScoredData):
        return group, group.wire()
    typed = ScoredData.model_validate(group)
    return typed, {k: v for k, v in group.items() if k in _WIRE_KEYS and v is not None}


SCORED_DATA_FIELDS: tuple[str, ...] = (
    "tokens",
    "masks",
    *(name for name in ScoredData.model_fields if name not in ("tokens", "masks")),
)
"""Every key of a group; a group in a batch carries all of them (null when absent)."""
_WIRE_KEYS = frozenset(SCORED_DATA_FIELDS)
