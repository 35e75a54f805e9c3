"""Atropos 0.4's ``managed_server`` module: the managed server with tool calls and
``<think>`` handling, its placeholder twin for OpenAI endpoints, and an AsyncOpenAI adapter.

The token tracking itself is :class:`atroposlib.envs.server_handling.managed.ManagedServer`;
this module adds what Atropos's chat path did around it: ``tools`` rendered by the chat
template and tool calls parsed from the reply (``tool_parser="hermes"``), ``<think>`` blocks
of earlier assistant turns kept through templates that would drop them, ``get_logprobs``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from openai.types import Completion
from openai.types.chat import ChatCompletion

from atroposlib.envs.server_handling import managed
from atroposlib.envs.server_handling.managed import SequenceNode
from atroposlib.envs.server_handling.server_baseline import APIServer
from atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atroposlib.errors import ConfigError

__all__ = [
    "APIServer",
    "DummyManagedServer",
    "ManagedServer",
    "ManagedServerAdapter",
    "SequenceNode",
]

ALLOW_DUMMY_VARIABLE = "ATROPOS_ALLOW_DUMMY_MANAGED_SERVER"
_THINK_OPEN, _THINK_CLOSE = "__MNGD_THINK__", "__MNGD_ENDTHINK__"


class ManagedServer(managed.ManagedServer):
    """``managed.ManagedServer`` with Atropos 0.4's chat options (tools, think blocks).

    ``tool_parser``: a ToolCallTranslator parser (``"hermes"``; any of vLLM's where vLLM
    imports); chats with ``tools`` then return the reply's calls as ``tool_calls`` while the
    node keeps the raw text, and earlier assistant ``tool_calls`` render as the text the
    model wrote.
    """

    def __init__(
        self,
        server: Any,
        tokenizer: Any = None,
        track_tree: bool = False,
        tool_parser: str | None = None,
        preserve_think_blocks: bool = False,
    ) -> None:
        super().__init__(server, tokenizer, track_tree)
        self._tool_parser_name = tool_parser
        self._translator: ToolCallTranslator | None = None
        self._preserve_think_blocks = preserve_think_blocks

    def _get_translator(self) -> ToolCallTranslator | None:
        """This conversation's translator (made on first use); None without a parser."""
        if self._translator is None and self._tool_parser_name is not None:
            try:
                self._translator = ToolCallTranslator(self.tokenizer, self._tool_parser_name)
            except ConfigError as exc:
                warnings.warn(f"{exc}; tool calls are not parsed", stacklevel=3)
                self._tool_parser_name = None
        return self._translator

    def render_prompt(self, messages: list[dict[str, Any]], tools: Any = None) -> str:
        """The chat template's prompt; a generation prompt unless the last turn is the
        assistant's own (then it is continued)."""
        translator = self._get_translator() if tools else None
        if translator is not None:
            messages = translator.convert_messages_for_template(messages)
        if not self._preserve_think_blocks:
            messages = [_protect_think(m) for m in messages]
        options: dict[str, Any] = {"tokenize": False}
        options["add_generation_prompt"] = not messages or messages[-1].get("role") != "assistant"
        if tools:
            options["tools"] = tools
        prompt = str(self.tokenizer.apply_chat_template(messages, **options))
        return prompt.replace(_THINK_OPEN, "<think>").replace(_THINK_CLOSE, "</think>")

    _convert_messages_to_prompt = render_prompt
    """Atropos's name."""

    async def chat_completion(
        self,
        *,
        messages: list[dict[str, Any]],
        n: int = 1,
        tools: Any = None,
        tool_choice: Any = None,
        **sampling: Any,
    ) -> ChatCompletion:
        prompt = self.render_prompt(messages, tools)
        sampled = await self._sample(prompt, n, sampling, add_special_tokens=False)
        translator = self._get_translator() if tools and tool_choice != "none" else None
        choices = []
        for index, (node, output_ids) in enumerate(sampled):
            text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            finish = managed.openai_reason(node)
            if translator is not None:
                raw = node.full_text[len(prompt) :]
                content, calls, parsed_finish = translator.parse_model_output(
                    raw, tool_choice or "auto", tools
                )
                if calls:
                    message = {"role": "assistant", "content": content, "tool_calls": calls}
                    finish = parsed_finish
            choices.append({"index": index, "message": message, "finish_reason": finish})
        return ChatCompletion.model_validate(
            managed.envelope("chat.completion", self.model_name, choices)
        )

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """Prompt logprobs of ``input_ids``, ``prompt`` (the server tokenizes it) or
        ``messages`` (rendered by the template, sent as ids with the prompt); see APIServer."""
        backend = getattr(self.server, "get_logprobs", None)
        if backend is None:
            raise NotImplementedError(
                f"{type(self.server).__name__} does not implement get_logprobs "
                "(prompt logprobs need server_type vllm, sglang or embedded)"
            )
        messages = kwargs.pop("messages", None)
        if messages is not None:
            kwargs["prompt"] = self.render_prompt(messages)
            kwargs.setdefault("input_ids", self._encode(kwargs["prompt"], False))
        result: dict[str, Any] = await backend(**kwargs)
        return result


def _protect_think(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if (
        message.get("role") != "assistant"
        or not isinstance(content, str)
        or "<think>" not in content
    ):
        return message
    return {**message, "content": content.replace("<think>", _THINK_OPEN).replace(
        "</think>", _THINK_CLOSE)}  # fmt: skip


class DummyManagedServer:
    """For endpoints without token ids (OpenAI): real replies, placeholder tokens.

    Every node has tokens 0..127, the first masked, logprobs -0.5 and
    ``metadata["dummy_tokens"] = True``: fine for evaluation, never for training.
    """

    DUMMY_TOKENS = list(range(128))
    DUMMY_MASKED_TOKENS = [-100, *range(1, 128)]
    DUMMY_LOGPROBS = [-0.5] * 128

    def __init__(self, server: Any, tokenizer: Any = None, track_tree: bool = False) -> None:
        self.server = server
        self.track_tree = track_tree
        self.current_nodes: list[SequenceNode] = []
        self.sequences: dict[str, SequenceNode] = {}

    def _track(self, full_text: str, reason: str | None) -> None:
        node = SequenceNode(
            full_text=full_text, tokens=self.DUMMY_TOKENS, masked_tokens=self.DUMMY_MASKED_TOKENS,
            logprobs=self.DUMMY_LOGPROBS,
            metadata={"finish_reason": reason or "stop", "dummy_tokens": True},
        )  # fmt: skip
        if self.track_tree:
            self.sequences[full_text] = node
        else:
            self.current_nodes.append(node)

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        response: ChatCompletion = await self.server.chat_completion(**kwargs)
        history = "\n\n".join(f"{m['role']}:{m['content']}" for m in kwargs.get("messages", []))
        for choice in response.choices:
            reply = f"assistant:{choice.message.content or ''}"
            self._track(f"{history}\n\n{reply}" if history else reply, choice.finish_reason)
        return response

    async def completion(self, **kwargs: Any) -> Completion:
        response: Completion = await self.server.completion(**kwargs)
        for choice in response.choices:
            self._track(f"{kwargs.get('prompt', '')}{choice.text or ''}", choice.finish_reason)
        return response

    def get_state(self) -> dict[str, Any]:
        if self.track_tree:
            return {"sequences": dict(self.sequences), "tree": dict(self.sequences)}
        return {"nodes": list(self.current_nodes)}

    def reset(self) -> None:
        self.current_nodes.clear()
        self.sequences.clear()

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError("placeholder managed servers have no prompt logprobs; "
                                  "use server_type vllm, sglang or embedded")  # fmt: skip


class TokenIdsUnavailableError(ConfigError, NotImplementedError):
    """managed_server() on a server without token ids (Atropos raised NotImplementedError)."""


def dummy_or_refuse(manager: Any, server: APIServer) -> DummyManagedServer:
    """The placeholder managed server when ``ATROPOS_ALLOW_DUMMY_MANAGED_SERVER`` is set."""
    if os.environ.get(ALLOW_DUMMY_VARIABLE, "").lower() not in ("1", "true", "yes"):
        raise TokenIdsUnavailableError(
            f"managed_server() needs token ids and logprobs, which server_type "
            f"{server.config.server_type!r} does not return: set --openai.server_type to "
            f"vllm, sglang or embedded, or export {ALLOW_DUMMY_VARIABLE}=1 for placeholder "
            "tokens (evaluation only, not for training)"
        )
    warnings.warn("managed_server() on an endpoint without token ids: placeholder tokens and "
                  "logprobs, not suitable for training", stacklevel=3)  # fmt: skip
    return DummyManagedServer(manager)


class ManagedServerAdapter:
    """A managed server seen as an ``AsyncOpenAI`` client (``client.chat.completions.create``)
    for libraries that want one; tokens are still tracked."""

    def __init__(self, managed_server: Any, base_url: str) -> None:
        self._managed = managed_server
        self.base_url = base_url
        self.chat = _Namespace(completions=_Creator(managed_server.chat_completion))
        self.completions = _Creator(managed_server.completion)

    async def post(self, path: str, body: dict[str, Any], cast_to: type) -> Any:
        raise NotImplementedError(f"ManagedServerAdapter cannot post to {path!r}; "
                                  "use chat.completions.create")  # fmt: skip

    def copy(self, **kwargs: Any) -> Any:
        raise NotImplementedError("ManagedServerAdapter cannot be copied")


class _Creator:
    def __init__(self, call: Any) -> None:
        self._call = call

    async def create(self, **kwargs: Any) -> Any:
        return await self._call(**kwargs)


class _Namespace:
    def __init__(self, **members: Any) -> None:
        self.__dict__.update(members)
