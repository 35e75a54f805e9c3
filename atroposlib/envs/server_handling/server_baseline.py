"""Inference server settings (Atropos 0.4 names) and the base class every backend extends."""

from __future__ import annotations

import logging
import time
from abc import ABC
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import httpx
import orjson
from pydantic import BaseModel, Field

from atroposlib.envs.server_handling.adaptive_semaphore import AsyncSemWithAdaptiveWeight
from atroposlib.envs.server_handling.circuit import CircuitBreaker
from atroposlib.envs.server_handling.http import HTTPTransportError, LeanHTTPClient
from atroposlib.envs.server_handling.reasoning import VALID_REASONING_EFFORTS, ReasoningConfig
from atroposlib.errors import InferenceEngineDeadError, InferenceError, InferenceRejectedError

logger = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = [
    "VALID_REASONING_EFFORTS",
    "APIServer",
    "APIServerConfig",
    "AsyncSemWithAdaptiveWeight",
    "GeneratedSequence",
    "ReasoningConfig",
    "ServerBaseline",
]

# What a server whose engine died answers (vLLM: HTTP 500 naming EngineDeadError, forever).
DEAD_ENGINE_MARKERS = ("EngineDeadError", "EngineCore encountered an issue")
ServerType = Literal["openai", "vllm", "sglang", "embedded", "trl"]
DEFAULT_OPENAI_URL = "https://api.openai.com/v1"


class ServerBaseline(BaseModel):
    """Settings for servers whose addresses are discovered (SLURM, or local ports 9004-9007)."""

    timeout: float = Field(default=1200, gt=0, description="Seconds before a request is abandoned.")
    num_max_requests_at_once: int = Field(
        default=512, ge=1, description="Concurrent training requests per server (scaled by weight)."
    )
    num_requests_for_eval: int = Field(
        default=64, ge=1, description="Concurrent evaluation requests per server."
    )
    model_name: str = Field(default="default", description="Model name sent with every request.")
    rolling_buffer_length: int = Field(
        default=1000, ge=1, description="Latencies kept per server for metrics."
    )
    server_type: ServerType = Field(
        default="openai",
        description="Backend: openai, vllm, sglang, embedded (these three give token ids) or "
        "trl (trl vllm-serve before TRL 1.0).",
    )
    tokenizer_name: str | None = Field(
        default=None,
        description="Tokenizer for managed mode when the env passes none (none: model_name).",
    )
    max_retries: int = Field(
        default=3, ge=0, description="Retries of a failed request (on any healthy server)."
    )
    retry_backoff_s: float = Field(
        default=0.5, ge=0, description="First retry delay; doubles per attempt, capped at 10 s."
    )
    circuit_failure_threshold: int = Field(
        default=3, ge=1, description="Consecutive failures that take a server out of rotation."
    )
    circuit_reset_s: float = Field(
        default=10.0, ge=0, description="Seconds out of rotation before a server is tried again."
    )
    dead_after_5xx: int = Field(
        default=20,
        ge=1,
        description="HTTP 5xx answers in a row after which a server counts as dead (its engine "
        "crashed): it leaves the rotation for good, and with no server left the env stops.",
    )
    tracing_enabled: bool = Field(default=False, description="Kept for Atropos configs; unused.")


class APIServerConfig(ServerBaseline):
    """One OpenAI-compatible inference server at ``base_url``."""

    api_key: str | None = Field(default="", description="Bearer token for the server.")
    base_url: str | None = Field(
        default="", description="Server URL including /v1 (empty: the OpenAI API)."
    )
    n_kwarg_is_ignored: bool = Field(
        default=False, description="The server ignores n: ask n times for one completion each."
    )
    health_check: bool = Field(
        default=True, description="Probe the server (GET /models) before trusting it again."
    )


def tokenizer_name_of(config: ServerBaseline) -> str:
    """The tokenizer to load for a server: ``tokenizer_name`` unless unset or Atropos's
    ``"none"``, then ``model_name``."""
    name = config.tokenizer_name
    return config.model_name if name in (None, "", "none") else name


@dataclass(frozen=True, slots=True)
class GeneratedSequence:
    """One sampled continuation with its token ids and per-token logprobs.

    ``weight_version``: the engine's weight version that sampled it (its first token), when the
    engine says; ``token_versions``: the version of each output token, when the engine reports
    spans (vLLM's ``weight_versions``; a reply that spans an in-flight weight update);
    ``versions_unknown``: why neither is known, where the engine's route reports none.
    """

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str | None = None
    weight_version: int | None = None
    token_versions: list[int] | None = None
    versions_unknown: str | None = None


def _error_message(content: bytes) -> str:
    """An error answer's message on one line (OpenAI-style ``{"error": {"message"}}``, FastAPI
    ``{"detail"}`` or the raw text), at most 200 characters.

    >>> _error_message(b'{"error": {"message": "EngineCore encountered an issue."}}')
    'EngineCore encountered an issue.'
    """
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        data = None
    text: Any = content.decode(errors="replace")
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            error = error.get("message", error)
        text = error or data.get("detail") or text
    return " ".join(str(text).split())[:200]


TokenAnswer = tuple[list[int], list[list[int]], list[list[float]], list[str]]
"""(prompt ids, output ids per choice, logprobs per choice, finish reasons)."""

Generate = Callable[[list[int], int, dict[str, Any]], Awaitable[Sequence[GeneratedSequence]]]


async def sample_tokens(
    generate: Generate, tokenizer: Callable[[], Any], kwargs: dict[str, Any]
) -> TokenAnswer:
    """``tokens_and_logprobs_completion`` on top of a ``generate``: ``input_ids`` are sent as
    they are; a ``prompt`` alone is tokenized as a completions endpoint does (special tokens
    added)."""
    sampling = {k: v for k, v in kwargs.items() if k not in ("model", "input_ids", "prompt")}
    prompt_ids = kwargs.get("input_ids")
    if prompt_ids is None:
        if kwargs.get("prompt") is None:
            raise ValueError("tokens_and_logprobs_completion needs input_ids or prompt")
        prompt_ids = tokenizer().encode(kwargs["prompt"])
    n = int(sampling.pop("n", 1) or 1)
    samples = await generate(list(prompt_ids), n, sampling)
    return (
        list(prompt_ids),
        [s.output_ids for s in samples],
        [s.logprobs for s in samples],
        [s.finish_reason for s in samples],
    )


class APIServer(ABC):  # noqa: B024 - an ABC as in Atropos 0.4; every hook has a default
    """One inference server: a single HTTP attempt per call; retries live in the manager.

    A backend overrides ``chat_completion`` / ``completion`` (and ``generate``,
    ``prompt_logprobs`` for token ids). A server written for Atropos 0.4 overrides its hooks
    instead, ``_chat_completion_wrapper``, ``_completion_wrapper`` and
    ``_get_logprobs_wrapper`` (kwargs with ``model`` set, ``split`` removed): the calls here
    wrap them with the same slots, timings and circuit breaker.
    """

    supports_token_ids: bool = False

    def __init__(
        self,
        config: APIServerConfig,
        reasoning_config: ReasoningConfig | None = None,
        *,
        http_client: httpx.AsyncClient | None = None,
    ):
        self.config = config
        self.reasoning_config = reasoning_config
        self._tokenizer: Any = None
        self.base_url = (config.base_url or DEFAULT_OPENAI_URL).rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.lean: LeanHTTPClient | None = None
        parts = urlsplit(self.base_url)
        self.origin = f"{parts.scheme}://{parts.netloc}"
        if http_client is None and parts.scheme == "http":
            self.lean = LeanHTTPClient(self.origin, headers=headers, timeout=config.timeout)
        self._owns_client = http_client is None
        self.http = http_client or httpx.AsyncClient(
            timeout=httpx.Timeout(config.timeout, connect=min(10.0, config.timeout)),
            headers=headers,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )
        self.breaker = CircuitBreaker(
            self.base_url,
            failure_threshold=config.circuit_failure_threshold,
            reset_after_s=config.circuit_reset_s,
        )
        self.weight = 1.0
        self.sem = AsyncSemWithAdaptiveWeight(config.num_max_requests_at_once)
        self.eval_sem = AsyncSemWithAdaptiveWeight(config.num_requests_for_eval)
        self.latencies: dict[str, deque[float]] = {
            split: deque(maxlen=config.rolling_buffer_length) for split in ("train", "eval")
        }
        self.attempts: dict[str, deque[int]] = {
            split: deque(maxlen=config.rolling_buffer_length) for split in ("train", "eval")
        }
        self.failures = 0
        self.requests = 0
        self.consecutive_5xx = 0
        self.dead: str | None = None
        """Why this server's engine counts as dead (it then never rejoins the rotation)."""

    @property
    def tokenizer(self) -> Any:
        """The served model's tokenizer (``tokenizer_name``, else ``model_name``), loaded once."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(tokenizer_name_of(self.config))
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    @property
    def server_healthy(self) -> bool:
        """Atropos name: whether the server is in rotation now (setting it to False takes it
        out for ``circuit_reset_s``; True puts it back)."""
        return self.breaker.allows_request()

    @server_healthy.setter
    def server_healthy(self, healthy: bool) -> None:
        if healthy:
            self.breaker.record_success()
        else:
            self.breaker.trip("marked unhealthy (server_healthy = False)")

    def slots(self, split: str) -> AsyncSemWithAdaptiveWeight:
        """The request slots of a split: eval has its own, not scaled by the env's weight."""
        return self.eval_sem if split == "eval" else self.sem

    def capacity(self, split: str) -> int:
        return self.slots(split).capacity

    def free_slots(self, split: str) -> int:
        return self.slots(split).free

    async def update_weight(self, weight: float) -> None:
        self.weight = max(0.01, weight)
        self.sem.update_weight(self.weight)

    @property
    def request_timings(self) -> deque[float]:
        """Atropos name: seconds taken by recent training requests."""
        return self.latencies["train"]

    @property
    def eval_request_timings(self) -> deque[float]:
        return self.latencies["eval"]

    @property
    def attempts_list(self) -> deque[int]:
        """Atropos name: attempts per recent training request on this server (always 1 here:
        retries are the manager's, on whichever server is free)."""
        return self.attempts["train"]

    @property
    def eval_attempts_list(self) -> deque[int]:
        return self.attempts["eval"]

    async def post_json(self, url: str, body: dict[str, Any]) -> Any:
        """POST and decode JSON; any transport, status or decoding problem is an InferenceError."""
        payload = orjson.dumps(body)
        if self.lean is not None and url.startswith(self.origin):
            try:
                answer = await self.lean.request("POST", url[len(self.origin) :] or "/", payload)
            except HTTPTransportError as exc:
                raise InferenceError(f"{url}: {exc}") from exc
            status, content = answer.status, answer.body
        else:
            try:
                response = await self.http.post(
                    url, content=payload, headers={"Content-Type": "application/json"}
                )
            except httpx.HTTPError as exc:
                raise InferenceError(f"{url}: {type(exc).__name__}: {exc}") from exc
            status, content = response.status_code, response.content
        if 400 <= status < 500 and status not in (408, 429):
            raise InferenceRejectedError(f"{url}: HTTP {status}: {content[:300]!r}", status)
        if status >= 500:
            raise self._server_error(url, status, content)
        if status >= 400:
            raise InferenceError(f"{url}: HTTP {status}: {content[:200]!r}")
        self.consecutive_5xx = 0
        try:
            return orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            raise InferenceError(f"{url}: answer is not JSON: {content[:200]!r}") from exc

    def _server_error(self, url: str, status: int, content: bytes) -> InferenceError:
        """The error for a 5xx answer; an InferenceEngineDeadError (and ``self.dead`` set) when
        the answer names a dead engine or ``dead_after_5xx`` answers in a row were 5xx."""
        self.consecutive_5xx += 1
        message = _error_message(content)
        was_alive = self.dead is None
        if any(marker in message for marker in DEAD_ENGINE_MARKERS):
            self.dead = (f"inference engine at {self.root_url} is dead (HTTP {status}: "
                         f"{message}); restart the server (its log has the cause)")  # fmt: skip
        elif self.consecutive_5xx >= self.config.dead_after_5xx:
            self.dead = (f"inference server at {self.root_url} answered HTTP 5xx to "
                         f"{self.consecutive_5xx} requests in a row (last: {status}: {message}); "
                         "its engine looks dead: restart it (its log has the cause)")  # fmt: skip
        if self.dead is not None:
            if was_alive:
                logger.error("%s: it leaves the rotation for good", self.dead)
            return InferenceEngineDeadError(self.dead)
        return InferenceError(f"{url}: HTTP {status}: {content[:200]!r}")

    async def timed(self, split: str, call: Awaitable[T]) -> T:
        """Run one request in one of the split's slots, keeping latency and the circuit
        breaker current."""
        async with self.slots(split):
            self.requests += 1
            self.breaker.on_request_start()
            start = time.perf_counter()
            try:
                result = await call
            except InferenceRejectedError:
                self.breaker.record_success()
                raise
            except InferenceError:
                self.failures += 1
                self.breaker.record_failure()
                raise
        self.latencies[split].append(time.perf_counter() - start)
        self.attempts[split].append(1)
        self.breaker.record_success()
        return result

    async def health_check(self) -> bool:
        """Whether ``GET {base_url}/models`` answers 200."""
        try:
            response = await self.http.get(f"{self.base_url}/models", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def chat_completion(self, **kwargs: Any) -> Any:
        """One ``/chat/completions`` request; returns ``openai.types.chat.ChatCompletion``."""
        split, kwargs = self._hook_kwargs(kwargs)
        return await self.timed(split, self._chat_completion_wrapper(**kwargs))

    async def completion(self, **kwargs: Any) -> Any:
        """One ``/completions`` request; returns ``openai.types.Completion``."""
        split, kwargs = self._hook_kwargs(kwargs)
        return await self.timed(split, self._completion_wrapper(**kwargs))

    def _hook_kwargs(self, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """(split, the kwargs an Atropos hook gets: ``model`` set, ``split`` removed)."""
        split = str(kwargs.pop("split", "train"))
        return split, {**kwargs, "model": self.config.model_name}

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} overrides neither chat_completion nor _chat_completion_wrapper"
        )

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} overrides neither completion nor _completion_wrapper"
        )

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        """Sample ``n`` continuations of ``input_ids`` with token ids and logprobs."""
        raise InferenceError(
            f"server_type {self.config.server_type!r} cannot return token ids; "
            "use server_type vllm, sglang or embedded for managed_server()"
        )

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> TokenAnswer:
        """Atropos 0.4's token call: ``input_ids`` (or ``prompt``, tokenized) and sampling
        kwargs -> (prompt ids, output ids per choice, logprobs per choice, finish reasons)."""
        return await sample_tokens(self.generate, lambda: self.tokenizer, kwargs)

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt logprobs (Atropos 0.4 shape): ``input_ids`` or ``prompt``, ``top_k`` ->
        ``{"prompt_tokens", "prompt_topk_token_ids", "prompt_topk_logprobs"}``."""
        split, kwargs = self._hook_kwargs(kwargs)
        result: dict[str, Any] = await self.timed(split, self._get_logprobs_wrapper(**kwargs))
        return result

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        prompt_ids = kwargs.get("input_ids")
        if prompt_ids is None:
            prompt_ids = list(self.tokenizer.encode(kwargs["prompt"]))
        top_k = max(1, int(kwargs.get("top_k", kwargs.get("top_logprobs", 1)) or 1))
        scored = await self.prompt_logprobs(list(prompt_ids), top_k)
        return {
            "prompt_tokens": list(prompt_ids),
            "prompt_topk_token_ids": [[t for t, _ in position] for position in scored],
            "prompt_topk_logprobs": [[lp for _, lp in position] for position in scored],
        }

    async def prompt_logprobs(
        self, input_ids: list[int], top_k: int
    ) -> list[list[tuple[int, float]]]:
        """Per prompt position: the scored token first, then the top-k alternatives, as
        (token id, logprob); position 0 has none."""
        raise InferenceError(
            f"server_type {self.config.server_type!r} cannot return prompt logprobs; "
            "use server_type vllm, sglang or embedded for a teacher server"
        )

    async def wandb_metrics(
        self, metrics_dict: dict[str, Any] | None, server_name: str | None
    ) -> dict[str, Any]:
        """Atropos 0.4's name: this server's metrics added to ``metrics_dict``."""
        out = dict(metrics_dict or {})
        out.update(self.metrics(server_name or "server"))
        return out

    def metrics(self, name: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for split, values in self.latencies.items():
            if values:
                ordered = sorted(values)
                suffix = "" if split == "train" else "_eval"
                out[f"server/{name}_request_time_avg{suffix}"] = sum(ordered) / len(ordered)
                out[f"server/{name}_request_time_p99{suffix}"] = ordered[
                    min(len(ordered) - 1, int(0.99 * len(ordered)))
                ]
        out[f"server/{name}_failures"] = float(self.failures)
        out[f"server/{name}_times_taken_out"] = float(self.breaker.times_opened)
        return out

    async def close(self) -> None:
        if self.lean is not None:
            await self.lean.aclose()
        if self._owns_client:
            await self.http.aclose()
