"""Settings of the embedded inference server (flags, ``ATROPOS_INFERENCE_*`` variables)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from atroposlib.security.access import AccessSettings
from atroposlib.utils.cli_settings import SharedApiKey


class InferenceSettings(BaseSettings, AccessSettings):
    """``atropos-inference``: an OpenAI-compatible server around a transformers causal LM.

    ``--api-key`` (else ``ATROPOS_INFERENCE_API_KEY``, else the run's ``ATROPOS_API_KEY``)
    guards every route but ``/health``; the weight routes take ``--admin-api-key`` (else
    ``ATROPOS_INFERENCE_ADMIN_API_KEY``, else the run's ``ATROPOS_ADMIN_API_KEY``) when set."""

    model_config = SettingsConfigDict(
        env_prefix="ATROPOS_INFERENCE_",
        cli_prog_name="atropos-inference",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="ignore",
    )

    model: str = Field(description="Local transformers model folder to serve.")
    port: int = Field(default=9001, ge=0, le=65535, description="TCP port to listen on.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="cpu", description="Where the model runs (auto: the GPU when torch sees one)."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weight dtype; auto is float32 on cpu, bfloat16 on cuda."
    )
    max_batch_size: int = Field(
        default=64,
        ge=1,
        le=1024,
        description="Most sequences decoded together in one step (on CPU a step of 64 rows "
        "costs about 2.4x one of 16: more rows, more tokens per second).",
    )
    share_prompt_prefixes: bool = Field(
        default=True,
        description="Run the beginning that distinct prompts share (a few-shot eval's chat "
        "template and examples) once and each prompt's own tail after it (same tokens; on CPU "
        "a 200-problem few-shot eval prefills several times faster).",
    )
    share_twin_rows: bool = Field(
        default=True,
        description="Compute one of the rows whose contexts are still the same (the samples "
        "of one prompt until they diverge: same logits) and give the others its logits, keys "
        "and values (same tokens and logprobs; in the RL demo about a third of the rows).",
    )
    max_request_sequences: int = Field(
        default=4096,
        ge=1,
        description="Most sequences one request may ask for (prompts x n); more: HTTP 413.",
    )
    max_request_tokens: int = Field(
        default=2**20,
        ge=1,
        description="Most new tokens one request may ask for (prompts x n x max_tokens, "
        "max_tokens defaulting to the context left); more: HTTP 413.",
    )
    max_body_bytes: int = Field(
        default=64 * 2**20, ge=1024, description="Largest request body accepted; more: HTTP 413."
    )
    max_weight_chunk_bytes: int = Field(
        default=4 * 2**30,
        ge=1024,
        description="Largest weight chunk POST /update_weights accepts (a trainer's in-flight "
        "update; one tensor may exceed sync_chunk_mb); more: HTTP 413.",
    )
    weight_roots: list[Path] = Field(
        default_factory=list,
        description="Folders under which /update_weights_from_disk and /v1/load_lora_adapter "
        "may load (safetensors only); any other path is refused. atropos-local passes its run's "
        "checkpoints folder; default: none, every load from disk refused.",
    )
    max_concurrent_weight_uploads: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Most POST /update_weights chunks read or staged at once; more: HTTP 429.",
    )
    weight_update_idle_s: float = Field(
        default=600.0,
        gt=0,
        description="A weight update with no call from its owner for this long may be replaced "
        "by another caller's /start_weight_update or /init_weight_transfer_engine.",
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        description="CPU threads torch uses (torch.set_num_threads); default: torch's choice. "
        "On a machine shared with other busy processes, fewer threads are often faster.",
    )
    max_threads: int | None = Field(
        default=None,
        ge=1,
        description="Use up to this many threads while the machine's other processes leave "
        "cores idle (measured every 0.25 s from /proc/stat), --threads (default 1) while they "
        "do not: atropos-local's server takes the trainer's core while the trainer waits for "
        "a batch and during the held-out evaluations. Default: always --threads.",
    )
    seed: int | None = Field(
        default=None,
        description="Seed of the sampler (torch's generators, set once at start): the same "
        "requests in the same order sample the same tokens; a request's own `seed` still wins. "
        "Default: unseeded.",
    )
    served_model_name: str | None = Field(
        default=None, description="Name clients pass as `model`; defaults to the --model value."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Logging level of the server process."
    )
    chat_template: Path | None = Field(
        default=None,
        description="A Jinja chat template file used instead of the model's own (vLLM's "
        "--chat-template), e.g. one that renders `tools`.",
    )
    tool_call_parser: Literal["hermes"] | None = Field(
        default=None,
        description="Parse tool calls out of chat replies to requests with `tools` and return "
        'them as OpenAI `tool_calls` (vLLM\'s --tool-call-parser); "hermes": '
        "<tool_call>{json}</tool_call>. Unset: replies stay text.",
    )
    sample_log: Path | None = Field(
        default=None,
        description="Test mode: append every sampled sequence (prompt ids, output ids, "
        "logprobs) to this JSONL file, to check clients train on exactly what was sampled.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        shared = SharedApiKey(settings_cls)
        return (init_settings, env_settings, dotenv_settings, file_secret_settings, shared)

    @model_validator(mode="after")
    def _model_folder_exists(self) -> InferenceSettings:
        if not Path(self.model).is_dir():
            raise ValueError(
                f"model {self.model!r} is not a folder; pass --model with the path of a "
                "transformers model folder (config.json, weights, tokenizer)"
            )
        if self.max_threads is not None and self.max_threads < (self.threads or 1):
            raise ValueError(
                f"max_threads {self.max_threads} is below threads {self.threads}; pass "
                "--max-threads >= --threads"
            )
        if self.chat_template is not None and not self.chat_template.is_file():
            raise ValueError(
                f"chat_template {str(self.chat_template)!r} is not a file; pass --chat-template "
                "with the path of a Jinja template"
            )
        return self

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model
