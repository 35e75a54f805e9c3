"""The engines' native wire models: /generate, /tokenize, weight updates, LoRA, pause, health.

vLLM's and SGLang's shapes (the embedded server answers them too): SGLang's token endpoint
``POST /generate``, ``POST /tokenize``, reload from disk, vLLM's in-flight weight transfer
(``/init_weight_transfer_engine`` ... ``/finish_weight_update``), LoRA hot-loading and pause.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from atroposlib.bounds import INT32_MAX, MAX_NAME_CHARS, MAX_PATH_CHARS
from atroposlib.wire.common import STOP_LIST_MAX, Body, Seed, Stop, TokenId


class GenerateSamplingParams(Body):
    """``sampling_params`` of SGLang's ``POST /generate``."""

    max_new_tokens: int = Field(default=128, ge=1, le=INT32_MAX)
    temperature: float = Field(default=1.0, ge=0.0, allow_inf_nan=False, description="0: greedy")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=-1, ge=-1, le=INT32_MAX, description="-1 or 0: off.")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0, allow_inf_nan=False, description="0: off.")
    stop: Stop | None = None
    stop_token_ids: list[TokenId] | None = Field(default=None, max_length=STOP_LIST_MAX)
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1, le=128)
    seed: Seed | None = Field(default=None, description="Also accepted as sampling_seed.")
    sampling_seed: Seed | None = None


class GenerateRequest(Body):
    """SGLang's token endpoint: ``input_ids`` for one prompt or a list of prompts."""

    input_ids: list[int] | list[list[int]] | None = None
    text: str | list[str] | None = Field(default=None, description="Instead of input_ids.")
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    return_logprob: bool = False
    top_logprobs_num: int = Field(default=0, ge=0, le=20)
    logprob_start_len: int = Field(
        default=-1,
        ge=-1,
        description="With return_logprob: prompt logprobs from this position on (-1: none).",
    )


class GenerateFinishReason(BaseModel):
    """``type`` is ``stop`` (``matched``: the eos/stop id or string), ``length``, or ``abort``
    (a pause in ``abort`` mode ended it; resubmit the ids so far to continue)."""

    type: Literal["stop", "length", "abort"]
    matched: int | str | None = None
    length: int | None = None
    message: str | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="Why it was aborted (SGLang's field); absent otherwise.",
    )


class WeightVersionSpan(BaseModel):
    """vLLM's span: output tokens ``[start, end)`` were sampled by weights ``version``."""

    version: str
    start: int
    end: int


class GenerateMetaInfo(BaseModel):
    """``output_token_logprobs``: ``[logprob, token_id, null]`` per output token."""

    output_token_logprobs: list[tuple[float, int, None]] | None = None
    output_top_logprobs: list[list[tuple[float, int, None]]] | None = None
    input_token_logprobs: list[tuple[float | None, int, None]] | None = None
    """Per prompt token: its logprob given the tokens before it (null for the first)."""
    input_top_logprobs: list[list[tuple[float, int, None]] | None] | None = None
    finish_reason: GenerateFinishReason
    prompt_tokens: int
    completion_tokens: int
    weight_version: int = Field(description="The version that sampled the first output token.")
    weight_versions: list[WeightVersionSpan] | None = Field(
        default=None, description="Every output token's version, as vLLM reports them."
    )


class GenerateResponse(BaseModel):
    """One generated sequence; ``/generate`` answers a list of these for batches or n > 1."""

    text: str
    output_ids: list[int]
    meta_info: GenerateMetaInfo


class TokenizeRequest(Body):
    """``POST /tokenize`` (vLLM's and SGLang's shape): the served tokenizer's ids for a text."""

    model: str | None = Field(default=None, description="The served model (ours ignores it).")
    prompt: str
    add_special_tokens: bool = Field(default=True, description="Add BOS etc. as encode() does.")


class TokenizeResponse(BaseModel):
    """The answer to ``POST /tokenize``; vLLM and SGLang answer these keys too."""

    tokens: list[int]
    count: int
    max_model_len: int


class UpdateWeightsRequest(Body):
    """``POST /update_weights_from_disk`` (SGLang's shape): a local transformers folder."""

    model_path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
    weight_version: str | None = Field(
        default=None, max_length=20, description="Version to report once loaded (a step)."
    )
    abort_all_requests: bool = Field(
        default=False, description="Abort the requests in flight instead of letting them finish."
    )


class UpdateWeightsResponse(BaseModel):
    success: bool
    message: str
    weight_version: int


class LoadLoraRequest(Body):
    """``POST /v1/load_lora_adapter`` (vLLM's shape): serve a PEFT adapter under a name."""

    lora_name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    lora_path: str = Field(min_length=1, max_length=MAX_PATH_CHARS)


UPDATE_TOKEN_HEADER = "x-weight-update-token"
"""The header carrying the ``update_token`` ``/start_weight_update`` answered."""

PauseMode = Literal["abort", "wait", "keep"]
"""vLLM's ``/pause`` modes: abort what is in flight, wait for it to finish, or keep it frozen."""


class WeightTransferInitInfo(Body):
    """``init_info`` of ``/init_weight_transfer_engine`` on the embedded server."""

    transport: Literal["http", "shm"] = Field(
        default="http",
        description="http: each chunk is a safetensors body; shm: a shared-memory block.",
    )


class WeightTransferInitRequest(Body):
    init_info: WeightTransferInitInfo = Field(default_factory=WeightTransferInitInfo)


class WeightTransferInitResponse(BaseModel):
    message: str
    parameters: dict[str, list[int]] = Field(description="Each served parameter's shape.")
    dtype: str = Field(description="The served dtype; send tensors in it to checksum them.")
    shm_prefix: str | None = Field(
        default=None,
        description="shm transport: the prefix every shared-memory block name must start with.",
    )


class WeightUpdateInfo(Body):
    """vLLM's ``update_info`` for a packed chunk in shared memory (``shm`` transport)."""

    names: list[Annotated[str, Field(max_length=MAX_NAME_CHARS)]] = Field(max_length=100_000)
    dtype_names: list[Annotated[str, Field(max_length=16)]] = Field(max_length=100_000)
    shapes: list[list[Annotated[int, Field(ge=0, le=INT32_MAX)]]] = Field(max_length=100_000)
    shm_name: str = Field(min_length=1, max_length=200)
    shm_bytes: int = Field(
        ge=1, le=2**48, description="The block's size in bytes; a block of another size is refused."
    )


class WeightUpdateRequest(Body):
    update_info: WeightUpdateInfo


class FinishWeightUpdateRequest(Body):
    weight_version: str | None = Field(
        default=None, max_length=20, description="The new version (a trainer step); default +1."
    )


class UpdateWeightVersionRequest(Body):
    """vLLM's ``/update_weight_version``: relabel the served weights (SGLang's body too)."""

    new_version: str = Field(min_length=1, max_length=20)


class WeightTransferResponse(BaseModel):
    message: str
    weight_version: str | None = None
    tensors: int | None = Field(default=None, description="Tensors staged or installed.")
    update_token: str | None = Field(
        default=None,
        description="/start_weight_update: send it as X-Weight-Update-Token with this update's "
        "/update_weights and /finish_weight_update.",
    )


class GenerationStateResponse(BaseModel):
    status: Literal["paused", "resumed"]


class IsPausedResponse(BaseModel):
    is_paused: bool


class WeightInfoResponse(BaseModel):
    weight_version: str


class WeightCheckerRequest(Body):
    """vLLM's ``/weight_checker``: ``checksum`` answers digests, ``compare`` checks them."""

    action: Literal["checksum", "compare"]
    baseline: dict[Annotated[str, Field(max_length=MAX_NAME_CHARS)], str] | None = None


class WeightCheckerResponse(BaseModel):
    checksums: dict[str, str] | None = None
    match: bool | None = None
    mismatches: list[str] | None = None


class ResetPrefixCacheResponse(BaseModel):
    success: bool


class InferenceHealthResponse(BaseModel):
    """``GET /health`` of the embedded server; the counts are taken after the last step."""

    status: Literal["ok"] = "ok"
    model: str
    weight_version: int
    requests_running: int = Field(default=0, description="Requests with rows in the batch.")
    requests_waiting: int = Field(default=0, description="Requests with no row in the batch.")
    sequences_running: int = 0
    sequences_waiting: int = 0
    decode_steps: int = Field(default=0, description="Decode steps since the server started.")
    computed_rows: int = Field(
        default=0,
        description="Rows the decode steps computed since the start (rows with the same context "
        "so far count once): over decode_steps, the rows a step computes on average.",
    )
    busy_seconds: float = Field(
        default=0.0, description="Seconds spent in prefill and decode steps since the start."
    )
    prefill_seconds: float = Field(
        default=0.0, description="Of busy_seconds, those spent prefilling new rows."
    )
    prompt_tokens: int = Field(
        default=0, description="Tokens of the distinct prompts prefilled since the start."
    )
    prompt_tokens_reused: int = Field(
        default=0,
        description="Of prompt_tokens, those not run again: they continued a beginning already "
        "computed (the prefix cache's hits, in tokens).",
    )
    preemptions: int = Field(default=0, description="Rows paused for a fairer share (resumed).")
    cancelled_requests: int = Field(default=0, description="Requests whose client left.")
    aborted_sequences: int = Field(default=0, description="Sequences ended by pause(abort).")
    paused: PauseMode | None = Field(default=None, description="The pause mode, if paused.")
