"""Managed mode: completions that come back with token ids, prompt masks and logprobs.

Each completion becomes a ``SequenceNode`` (prompt + completion). A later prompt that starts
with a node's ``full_text`` extends that node: its tokens, masks and logprobs are reused as
they are and only the new suffix is tokenized, so multi-turn rollouts are never re-tokenized;
the node's continuations take its place in ``nodes``. A prompt that extends no node starts a
new one, tokenized as the engine's own endpoint would: a raw ``completion`` prompt with the
tokenizer's special tokens (BOS), a chat prompt rendered by the template without (the
template writes them).

The node's prompt is the ids the server reports it conditioned on (token servers echo the ids
they were sent); a server that changes an extended node's ids is an error, never a silent
re-tokenization.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Protocol

from openai.types import Completion
from pydantic import BaseModel

from atroposlib.envs.server_handling.server_baseline import TokenAnswer
from atroposlib.errors import ConfigError, InferenceError
from atroposlib.group import MASK_IGNORE_INDEX


class TokenBackend(Protocol):
    """What managed mode needs of a server: an APIServer, a ServerManager or a harness."""

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> TokenAnswer: ...


PROMPT_LOGPROB = 1.0
"""Logprob placeholder on prompt positions (an impossible value, so trainers can spot it)."""


class SequenceNode(BaseModel):
    full_text: str
    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    metadata: dict[str, Any] | None = None


class ManagedServer:
    """Wraps a token server inside ``async with server.managed_server(tokenizer=...)``.

    ``tokenizer``: the server's own (``server.tokenizer``) when not given. ``track_tree``
    (Atropos 0.4): keep every completion as its own node, keyed by its ``full_text`` in
    ``sequences``, with the whole context masked (one trained span per node, for per-step
    advantages); a continuation still reuses its parent's ids. ``get_state()`` then answers
    ``{"sequences": ..., "tree": ...}`` instead of ``{"nodes": ...}``.
    """

    def __init__(self, server: TokenBackend, tokenizer: Any = None, track_tree: bool = False):
        self.server = server
        self.tokenizer = tokenizer if tokenizer is not None else _tokenizer_of(server)
        self.model_name = _model_name_of(server)
        self.track_tree = track_tree
        self.nodes: list[SequenceNode] = []
        self.sequences: dict[str, SequenceNode] = {}

    @property
    def current_nodes(self) -> list[SequenceNode]:
        """Atropos's name for the tracked nodes."""
        return self.nodes

    def get_state(self) -> dict[str, Any]:
        if self.track_tree:
            return {"sequences": dict(self.sequences), "tree": dict(self.sequences)}
        return {"nodes": list(self.nodes)}

    def reset(self) -> None:
        self.nodes = []
        self.sequences = {}

    async def completion(self, *, prompt: str, n: int = 1, **sampling: Any) -> Completion:
        sampled = await self._sample(prompt, n, sampling, add_special_tokens=True)
        choices = [
            {
                "index": i,
                "text": self.tokenizer.decode(output_ids, skip_special_tokens=True),
                "finish_reason": openai_reason(node),
            }
            for i, (node, output_ids) in enumerate(sampled)
        ]
        return Completion.model_validate(envelope("text_completion", self.model_name, choices))

    async def _sample(
        self, prompt: str, n: int, sampling: dict[str, Any], *, add_special_tokens: bool
    ) -> list[tuple[SequenceNode, list[int]]]:
        """``n`` continuations of ``prompt`` as nodes (replacing the node it extends), each
        with its output ids."""
        parent = self._longest_prefix_node(prompt)
        if parent is None:
            input_ids = self._encode(prompt, add_special_tokens)
        else:
            input_ids = [*parent.tokens, *self._encode(prompt[len(parent.full_text) :], False)]
        answer = await self.server.tokens_and_logprobs_completion(
            prompt=prompt, input_ids=input_ids, n=n, **sampling
        )
        prompt_ids, outputs, logprobs, reasons = _checked(answer, parent)
        if parent is None or self.track_tree:
            context_masks = [MASK_IGNORE_INDEX] * len(prompt_ids)
            context_logprobs = [PROMPT_LOGPROB] * len(prompt_ids)
        else:
            added = len(prompt_ids) - len(parent.tokens)
            context_masks = [*parent.masked_tokens, *[MASK_IGNORE_INDEX] * added]
            context_logprobs = [*parent.logprobs, *[PROMPT_LOGPROB] * added]
        sampled = []
        where = _session_metadata(self.server)
        for output_ids, output_logprobs, reason in zip(outputs, logprobs, reasons, strict=True):
            raw = self.tokenizer.decode(output_ids, skip_special_tokens=False)
            node = SequenceNode(
                full_text=prompt + raw,
                tokens=[*prompt_ids, *output_ids],
                masked_tokens=[*context_masks, *output_ids],
                logprobs=[*context_logprobs, *output_logprobs],
                metadata={"finish_reason": reason, **where},
            )
            sampled.append((node, list(output_ids)))
        children = [node for node, _ in sampled]
        if self.track_tree:
            self.sequences.update((node.full_text, node) for node in children)
        elif parent is None:
            self.nodes.extend(children)
        else:
            at = self.nodes.index(parent)
            self.nodes[at : at + 1] = children
        return sampled

    def _longest_prefix_node(self, prompt: str) -> SequenceNode | None:
        known = self.sequences.values() if self.track_tree else self.nodes
        matches = [node for node in known if prompt.startswith(node.full_text)]
        return max(matches, key=lambda node: len(node.full_text), default=None)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if not text:
            return []
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))


def _checked(answer: TokenAnswer, parent: SequenceNode | None) -> TokenAnswer:
    prompt_ids, outputs, logprobs, reasons = answer
    if parent is not None and list(prompt_ids[: len(parent.tokens)]) != parent.tokens:
        raise InferenceError(
            "the server changed the ids of the conversation so far (it re-tokenized the "
            "prompt); managed mode needs a server that samples from the ids it is sent"
        )
    if not len(outputs) == len(logprobs) == len(reasons):
        raise InferenceError(
            f"the server returned {len(outputs)} outputs, {len(logprobs)} logprob rows "
            f"and {len(reasons)} finish reasons"
        )
    for ids, row in zip(outputs, logprobs, strict=True):
        if len(ids) != len(row):
            raise InferenceError(f"the server returned {len(row)} logprobs for {len(ids)} ids")
    return list(prompt_ids), outputs, logprobs, reasons


def _session_metadata(server: Any) -> dict[str, Any]:
    """What a backend that keeps a session on one server says about where it sampled (the
    server, any moves); nothing for other backends."""
    describe = getattr(server, "node_metadata", None)
    return dict(describe()) if callable(describe) else {}


def _tokenizer_of(server: Any) -> Any:
    tokenizer = getattr(server, "tokenizer", None)
    if tokenizer is None:
        raise ConfigError("ManagedServer needs a tokenizer: pass tokenizer=self.tokenizer")
    return tokenizer


def _model_name_of(server: Any) -> str:
    servers = getattr(server, "servers", None) or [server]
    return str(getattr(getattr(servers[0], "config", None), "model_name", None) or "managed")


def openai_reason(node: SequenceNode) -> str:
    reason = (node.metadata or {}).get("finish_reason")
    return reason if reason in ("stop", "length", "tool_calls", "content_filter") else "stop"


def envelope(kind: str, model: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": f"managed-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": choices,
    }
