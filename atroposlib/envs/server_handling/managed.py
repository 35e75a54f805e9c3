"""Managed mode: completions that come back with token ids, prompt masks and logprobs.

Each completion becomes a ``SequenceNode`` (prompt + completion). A later prompt that starts
with a node's ``full_text`` extends that node: its tokens, masks and logprobs are reused as
they are and only the new suffix is tokenized, so multi-turn rollouts are never re-tokenized.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from openai.types import Completion
from openai.types.chat import ChatCompletion
from pydantic import BaseModel

from atroposlib.envs.server_handling.server_baseline import GeneratedSequence
from atroposlib.protocol import MASK_IGNORE_INDEX

logger = logging.getLogger(__name__)


class TokenSampler(Protocol):
    """What managed mode needs of a ServerManager: token-in/token-out sampling, logprobs."""

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> Sequence[GeneratedSequence]: ...

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]: ...


PROMPT_LOGPROB = 1.0
"""Logprob placeholder on prompt positions (an impossible value, so trainers can spot it)."""


class SequenceNode(BaseModel):
    full_text: str
    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    metadata: dict[str, Any] | None = None


class ManagedServer:
    """Wraps a ServerManager inside ``async with server.managed_server(tokenizer=...)``."""

    def __init__(self, manager: TokenSampler, tokenizer: Any) -> None:
        self.manager = manager
        self.tokenizer = tokenizer
        self.nodes: list[SequenceNode] = []

    def get_state(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes)}

    def reset(self) -> None:
        self.nodes = []

    async def completion(self, *, prompt: str, n: int = 1, **sampling: Any) -> Completion:
        sequences = await self._extend(prompt, n, sampling)
        choices = [
            {"index": i, "text": text, "finish_reason": _openai_reason(reason)}
            for i, (text, reason) in enumerate(sequences)
        ]
        return Completion.model_validate(_envelope("text_completion", choices))

    async def chat_completion(
        self, *, messages: list[dict[str, Any]], n: int = 1, **sampling: Any
    ) -> ChatCompletion:
        prompt = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        sequences = await self._extend(prompt, n, sampling)
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "finish_reason": _openai_reason(reason),
            }
            for i, (text, reason) in enumerate(sequences)
        ]
        return ChatCompletion.model_validate(_envelope("chat.completion", choices))

    def input_ids_for(self, prompt: str) -> list[int]:
        """The ids a request for ``prompt`` sends: the longest tracked node it extends, as
        recorded, then only the new text tokenized."""
        parent = self._longest_prefix_node(prompt)
        if parent is None:
            return self._encode(prompt)
        return [*parent.tokens, *self._encode(prompt[len(parent.full_text) :])]

    async def _sample(
        self, prompt: str, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> tuple[list[int], Sequence[GeneratedSequence]]:
        """(the ids the engine saw, its samples); a subclass may route elsewhere."""
        return input_ids, await self.manager.generate(input_ids, n, sampling)

    async def _extend(self, prompt: str, n: int, sampling: dict[str, Any]) -> list[tuple[str, str]]:
        parent = self._longest_prefix_node(prompt)
        prompt_ids, samples = await self._sample(prompt, self.input_ids_for(prompt), n, sampling)
        if parent is not None and prompt_ids[: len(parent.tokens)] != parent.tokens:
            logger.warning(
                "the engine saw other ids than the tracked node's (%d recorded ids); the "
                "reply starts a new node and the old one is kept as it was",
                len(parent.tokens),
            )
            parent = None
        prefix_masks = parent.masked_tokens if parent is not None else []
        prefix_logprobs = parent.logprobs if parent is not None else []
        new_length = len(prompt_ids) - len(prefix_masks)
        if parent is not None and parent in self.nodes:  # replaced only once sampled
            self.nodes.remove(parent)
        out: list[tuple[str, str]] = []
        for sample in samples:
            text = self.tokenizer.decode(sample.output_ids, skip_special_tokens=True)
            raw = self.tokenizer.decode(sample.output_ids, skip_special_tokens=False)
            self.nodes.append(
                SequenceNode(
                    full_text=prompt + raw,
                    tokens=[*prompt_ids, *sample.output_ids],
                    masked_tokens=[
                        *prefix_masks,
                        *[MASK_IGNORE_INDEX] * new_length,
                        *sample.output_ids,
                    ],
                    logprobs=[
                        *prefix_logprobs,
                        *[PROMPT_LOGPROB] * new_length,
                        *sample.logprobs,
                    ],
                    metadata=_metadata(sample, parent),
                )
            )
            out.append((text, sample.finish_reason))
        return out

    def _longest_prefix_node(self, prompt: str) -> SequenceNode | None:
        matches = [node for node in self.nodes if prompt.startswith(node.full_text)]
        return max(matches, key=lambda node: len(node.full_text), default=None)

    def _encode(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def _metadata(sample: GeneratedSequence, parent: SequenceNode | None) -> dict[str, Any]:
    """The finish reason, and the oldest weight version that sampled any of the node's ids
    (when the engine says; staleness is judged on the oldest)."""
    metadata: dict[str, Any] = {"finish_reason": sample.finish_reason}
    versions = [(parent.metadata or {}).get("weight_version") if parent else None,
                sample.weight_version]  # fmt: skip
    known = [v for v in versions if v is not None]
    if known:
        metadata["weight_version"] = min(known)
    return metadata


def _openai_reason(reason: str) -> str:
    return reason if reason in ("stop", "length", "tool_calls", "content_filter") else "stop"


def _envelope(kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "managed",
        "object": kind,
        "created": int(time.time()),
        "model": "managed",
        "choices": choices,
    }
