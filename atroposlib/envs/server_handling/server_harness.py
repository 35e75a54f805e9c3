"""A server that answers locally: canned replies for ``--testing``, scripted ones for tests.

Nothing scripted, every request gets a canned answer (``"test response <i>"``, token ids
1..k, logprobs -1), so an env runs end to end with no inference server. A test scripts exact
answers with Atropos 0.4's calls, keyed by what the request carries:

    harness.set_desired_response(messages, create_chat_completion("hi"))  # chat_completion
    harness.set_desired_completion("2+2=", create_completion("4"))        # completion
    harness.set_tokens_and_logprobs_response(prompt="2+2=", prompt_tokens=[...],
        output_tokens_list=[[...]], output_logprobs_list=[[...]], finish_reasons=["stop"])

Once a kind of answer is scripted, a request of that kind with no script is a ``KeyError``
naming the key, never a silent canned answer. The token script reports its ``prompt_tokens``
as the ids the engine conditioned on, as a real token server reports the ids it was sent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from openai.types import Completion
from openai.types.chat import ChatCompletion

from atroposlib.envs.server_handling.adaptive_semaphore import AsyncSemWithAdaptiveWeight
from atroposlib.envs.server_handling.server_baseline import (
    APIServerConfig,
    GeneratedSequence,
    TokenAnswer,
    sample_tokens,
    tokenizer_name_of,
)

__all__ = ["ServerHarness", "TokenScript", "create_chat_completion", "create_completion"]

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class TokenScript(NamedTuple):
    """A scripted token answer: what ``tokens_and_logprobs_completion`` returns for a prompt."""

    prompt_tokens: list[int]
    output_tokens_list: list[list[int]]
    output_logprobs_list: list[list[float]]
    finish_reasons: list[str]


class ServerHarness:
    """A local server for ``--testing`` and tests; see the module docstring.

    Not an APIServer (nor is Atropos 0.4's): it has the calls and request slots a
    ServerManager routes to, its own ``server_healthy`` flag, and no HTTP client.
    """

    supports_token_ids = True
    dead: str | None = None

    def __init__(self, config: APIServerConfig | None = None) -> None:
        self.config = config or APIServerConfig(base_url="harness://local", health_check=False)
        self.base_url = str(self.config.base_url)
        self.response_map: dict[str, ChatCompletion | Completion] = {}
        self.tokens_and_logprobs_map: dict[str, TokenScript] = {}
        self.server_healthy = True
        """In rotation; a test may set it (Atropos's proxy tests do)."""
        self.weight = 1.0
        self.sem = AsyncSemWithAdaptiveWeight(self.config.num_max_requests_at_once)
        self.eval_sem = AsyncSemWithAdaptiveWeight(self.config.num_requests_for_eval)
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        """The configured model's tokenizer, loaded on first use (token answers need it only
        for a ``prompt`` given as text)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(tokenizer_name_of(self.config))
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self._tokenizer = value

    async def update_weight(self, weight: float) -> None:
        self.weight = max(0.01, weight)
        self.sem.update_weight(self.weight)

    def metrics(self, name: str) -> dict[str, float]:
        """The counters an APIServer reports (a harness never fails or leaves the rotation)."""
        return {f"server/{name}_failures": 0.0, f"server/{name}_times_taken_out": 0.0}

    async def close(self) -> None:
        return None

    # ---- scripting ----------------------------------------------------------------------

    @staticmethod
    def conv_to_dictkey(input_message: Sequence[dict[str, Any]]) -> str:
        """The script key of a chat: its roles and contents, in order."""
        return json.dumps([[m.get("role"), m.get("content")] for m in input_message])

    def set_desired_response(
        self, input_message: Sequence[dict[str, Any]], desired_response: ChatCompletion
    ) -> None:
        """``chat_completion(messages=input_message)`` answers ``desired_response``."""
        self.response_map[self.conv_to_dictkey(input_message)] = desired_response

    def set_desired_completion(self, input_message: str, completion: Completion) -> None:
        """``completion(prompt=input_message)`` answers ``completion``."""
        self.response_map[input_message] = completion

    def set_tokens_and_logprobs_response(
        self,
        prompt: str,
        prompt_tokens: Sequence[int],
        output_tokens_list: Sequence[Sequence[int]],
        output_logprobs_list: Sequence[Sequence[float]],
        finish_reasons: Sequence[str],
    ) -> None:
        """``tokens_and_logprobs_completion(prompt=prompt, ...)`` answers these ids and
        logprobs, one row per sampled sequence."""
        rows = len(output_tokens_list)
        if len(output_logprobs_list) != rows or len(finish_reasons) != rows:
            raise ValueError(
                f"output_logprobs_list has {len(output_logprobs_list)} rows and finish_reasons "
                f"{len(finish_reasons)}; output_tokens_list has {rows}: give one per sequence"
            )
        for index, (ids, logprobs) in enumerate(
            zip(output_tokens_list, output_logprobs_list, strict=True)
        ):
            if len(ids) != len(logprobs):
                raise ValueError(
                    f"output_logprobs_list[{index}] has {len(logprobs)} logprobs for "
                    f"{len(ids)} tokens in output_tokens_list[{index}]"
                )
        self.tokens_and_logprobs_map[prompt] = TokenScript(
            list(prompt_tokens),
            [list(ids) for ids in output_tokens_list],
            [list(logprobs) for logprobs in output_logprobs_list],
            list(finish_reasons),
        )

    # ---- answering ----------------------------------------------------------------------

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        scripted = self._scripted(ChatCompletion, self.conv_to_dictkey(kwargs["messages"]))
        if scripted is not None:
            return scripted
        choices = [
            {
                "index": i,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": f"test response {i}"},
            }
            for i in range(int(kwargs.get("n") or 1))
        ]
        return ChatCompletion.model_validate(self._envelope("chat.completion", choices))

    async def completion(self, **kwargs: Any) -> Completion:
        scripted = self._scripted(Completion, str(kwargs.get("prompt")))
        if scripted is not None:
            return scripted
        choices = [
            {"index": i, "finish_reason": "stop", "text": f"test response {i}"}
            for i in range(int(kwargs.get("n") or 1))
        ]
        return Completion.model_validate(self._envelope("text_completion", choices))

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> TokenAnswer:
        if not self.tokens_and_logprobs_map:
            return await sample_tokens(self.generate, lambda: self.tokenizer, kwargs)
        prompt = kwargs.get("prompt")
        script = self.tokens_and_logprobs_map.get(prompt) if isinstance(prompt, str) else None
        if script is None:
            raise KeyError(
                f"ServerHarness has no token answer scripted for prompt {prompt!r} "
                f"({len(self.tokens_and_logprobs_map)} scripted; see "
                "set_tokens_and_logprobs_response)"
            )
        return (
            list(script.prompt_tokens),
            [list(ids) for ids in script.output_tokens_list],
            [list(logprobs) for logprobs in script.output_logprobs_list],
            list(script.finish_reasons),
        )

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        length = max(
            1, min(8, int(sampling.get("max_tokens") or sampling.get("max_new_tokens") or 8))
        )
        return [
            GeneratedSequence([1 + (i + j) % 50 for j in range(length)], [-1.0] * length, "stop")
            for i in range(n)
        ]

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError(
            "ServerHarness does not implement get_logprobs: assign the test's own "
            "(harness.get_logprobs = fake) or use a token server (vllm, sglang, embedded)"
        )

    async def health_check(self) -> bool:
        return True

    def _scripted(self, kind: type[Any], key: str) -> Any:
        scripts = {k: v for k, v in self.response_map.items() if isinstance(v, kind)}
        if not scripts:
            return None
        if key not in scripts:
            raise KeyError(
                f"ServerHarness has no {kind.__name__} scripted for {key!r} "
                f"({len(scripts)} scripted)"
            )
        return scripts[key].model_copy(deep=True)

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": "harness",
            "object": kind,
            "created": int(time.time()),
            "model": getattr(self.config, "model_name", "harness"),
            "choices": choices,
        }


def create_chat_completion(
    resp: str | Sequence[str],
    n: int = 1,
    finish_reason: FinishReason | Sequence[FinishReason] = "stop",
) -> ChatCompletion:
    """A ChatCompletion with ``n`` assistant replies (``resp``: one text, or one per reply)."""
    texts, reasons = _per_choice(resp, n), _per_choice(finish_reason, n)
    choices = [
        {"index": i, "finish_reason": reasons[i],
         "message": {"role": "assistant", "content": texts[i]}}
        for i in range(n)
    ]  # fmt: skip
    return ChatCompletion.model_validate(
        {"id": "test_id", "object": "chat.completion", "created": 0, "model": "test_model",
         "choices": choices}
    )  # fmt: skip


def create_completion(
    resp: str | Sequence[str],
    n: int = 1,
    finish_reason: FinishReason | Sequence[FinishReason] = "stop",
) -> Completion:
    """A Completion with ``n`` choices (``resp``: one text, or one per choice)."""
    texts, reasons = _per_choice(resp, n), _per_choice(finish_reason, n)
    choices = [{"index": i, "finish_reason": reasons[i], "text": texts[i]} for i in range(n)]
    return Completion.model_validate(
        {"id": "test_id", "object": "text_completion", "created": 0, "model": "test_model",
         "choices": choices}
    )  # fmt: skip


def _per_choice(value: str | Sequence[str], n: int) -> list[str]:
    if isinstance(value, str):
        return [value] * n
    if len(value) < n:
        raise ValueError(f"{len(value)} values given for n={n} choices")
    return list(value[:n])
