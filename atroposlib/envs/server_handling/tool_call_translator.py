"""Tool calls both ways between a model's raw text and OpenAI's structured ``tool_calls``.

An agent speaks OpenAI: its assistant messages carry ``tool_calls`` and the replies it gets
should too. The model speaks text (hermes: ``<tool_call>{"name": ..., "arguments": ...}
</tool_call>``), and the trainer needs the exact tokens it sampled. ``ToolCallTranslator``
sits between them for one conversation:

- outbound, ``parse_model_output`` turns a reply's raw text into ``(content, tool_calls,
  finish_reason)`` and remembers which raw text each call id came from;
- inbound, ``convert_messages_for_template`` puts that raw text back in place of an assistant
  message's ``tool_calls``, so the chat template renders what the model wrote and the next
  prompt extends the sampled tokens instead of re-tokenizing a paraphrase.

Parsing uses vLLM's tool parsers (``ToolParserManager``: hermes, llama3_json, mistral, ...)
when ``vllm`` imports, and our own hermes parser (``atroposlib.envs.hermes``) otherwise.
``VLLM_AVAILABLE`` and vLLM's classes (``ToolParserManager``, ``ToolParser``,
``ChatCompletionRequest``, ``ExtractedToolCallInformation``; None without vLLM) are looked up
on first use, since importing vLLM takes seconds.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_message_function_tool_call import Function
from pydantic import Field, ValidationError

from atroposlib.envs.hermes import parse_tool_calls, tool_calls_as_text
from atroposlib.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["VLLM_AVAILABLE", "FunctionCall", "ToolCall", "ToolCallTranslator"]

BUILTIN_PARSERS = ("hermes",)

VLLM_AVAILABLE: bool
"""Whether vLLM's tool parsers import here (answered by ``__getattr__`` on first use)."""

_VLLM_LOCATIONS: dict[str, tuple[str, ...]] = {
    "ToolParserManager": (
        "vllm.tool_parsers.abstract_tool_parser",
        "vllm.entrypoints.openai.tool_parsers",
    ),
    "ToolParser": (
        "vllm.tool_parsers.abstract_tool_parser",
        "vllm.entrypoints.openai.tool_parsers",
    ),
    "ChatCompletionRequest": (
        "vllm.entrypoints.openai.chat_completion.protocol",
        "vllm.entrypoints.openai.protocol",
    ),
    "ExtractedToolCallInformation": (
        "vllm.entrypoints.generate.base.protocol",
        "vllm.entrypoints.openai.engine.protocol",
        "vllm.entrypoints.openai.protocol",
    ),
}
"""Where each vLLM class lives, newest vLLM first (they moved between releases)."""


class _ReadsLikeADict:
    """``call["function"]["name"]`` as well as ``call.function.name``: OpenAI's objects for
    code written against ``tool_calls`` as plain dicts."""

    def __getitem__(self, key: str) -> Any:
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class FunctionCall(_ReadsLikeADict, Function):
    """The called function: ``name`` and ``arguments`` (a JSON string)."""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCall(_ReadsLikeADict, ChatCompletionMessageFunctionToolCall):
    """One tool call of an assistant reply, as OpenAI's ``message.tool_calls[i]``."""

    id: str = Field(default_factory=new_call_id)
    type: Literal["function"] = "function"
    function: FunctionCall


@functools.cache
def _vllm_classes() -> dict[str, Any] | None:
    found: dict[str, Any] = {}
    try:
        for name, modules in _VLLM_LOCATIONS.items():
            for module in modules:
                try:
                    found[name] = getattr(importlib.import_module(module), name)
                    break
                except (ImportError, AttributeError):
                    continue
            else:
                raise ImportError(f"no vLLM module among {modules} defines {name}")
    except (ImportError, OSError, RuntimeError) as exc:
        if importlib.util.find_spec("vllm") is not None:
            logger.warning("vllm is installed but its tool parsers do not import: %s", exc)
        return None
    return found


def __getattr__(name: str) -> Any:
    if name == "VLLM_AVAILABLE":
        return _vllm_classes() is not None
    if name in _VLLM_LOCATIONS:
        return (_vllm_classes() or {}).get(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ToolCallTranslator:
    """Translates one conversation's tool calls; see the module docstring.

    ``call_id_to_raw_text``: each tool call id handed out -> the raw reply it was parsed from.
    ``parser``: the vLLM parser in use, or None when our hermes parser is.
    """

    def __init__(self, tokenizer: Any, parser_name: str = "hermes") -> None:
        self.tokenizer = tokenizer
        self.parser_name = parser_name
        self.parser: Any = None
        self.call_id_to_raw_text: dict[str, str] = {}
        vllm = _vllm_classes()
        if vllm is not None:
            try:
                parser_class = vllm["ToolParserManager"].get_tool_parser(parser_name)
            except KeyError:
                known = sorted(vllm["ToolParserManager"].list_registered())
                raise ConfigError(
                    f"tool_parser {parser_name!r} is not one of vLLM's: {', '.join(known)}"
                ) from None
            try:
                self.parser = parser_class(tokenizer)
            except (RuntimeError, ValueError, KeyError) as exc:
                if parser_name not in BUILTIN_PARSERS:
                    raise ConfigError(
                        f"vLLM's {parser_name!r} tool parser refuses this tokenizer: {exc}"
                    ) from exc
                logger.warning(
                    "vLLM's %r tool parser refuses this tokenizer (%s); using ours",
                    parser_name,
                    exc,
                )
        elif parser_name not in BUILTIN_PARSERS:
            raise ConfigError(
                f"tool_parser {parser_name!r} needs vLLM's tool parsers (pip install vllm); "
                f"without vLLM we parse {', '.join(BUILTIN_PARSERS)}"
            )

    # ---- outbound: the model's text -> OpenAI fields ------------------------------------

    def parse_model_output(
        self,
        raw_text: str,
        tool_choice: Any = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[str | None, list[ToolCall] | None, str]:
        """``(content, tool_calls, finish_reason)`` of one reply. No ``tools``, or
        ``tool_choice="none"``: the raw text as content, no calls, ``"stop"``. A reply whose
        calls do not parse is content too."""
        if tool_choice == "none" or not tools:
            return raw_text, None, "stop"
        if self.parser is None:
            content, found = parse_tool_calls(raw_text, allow_unclosed=True)
            calls = [ToolCall.model_validate(call) for call in found]
        else:
            content, calls = self._parse_with_vllm(raw_text, tool_choice, tools)
        if not calls:
            return raw_text, None, "stop"
        for call in calls:
            self.call_id_to_raw_text[call.id] = raw_text
        return content, calls, "tool_calls"

    def _parse_with_vllm(
        self, raw_text: str, tool_choice: Any, tools: Sequence[Mapping[str, Any]]
    ) -> tuple[str | None, list[ToolCall]]:
        request_class = _vllm_classes()["ChatCompletionRequest"]  # type: ignore[index]
        try:
            request = request_class(
                messages=[{"role": "user", "content": ""}],
                model="tool-call-translator",
                tools=list(tools),
                tool_choice=tool_choice if isinstance(tool_choice, str) else "auto",
            )
        except ValidationError as exc:
            raise ValueError(f"tools: not OpenAI tool definitions: {exc}") from exc
        extracted = self.parser.extract_tool_calls(raw_text, request)
        if not extracted.tools_called:
            return raw_text, []
        calls = [
            ToolCall(
                id=call.id,
                function=FunctionCall(name=call.function.name, arguments=call.function.arguments),
            )
            for call in extracted.tool_calls
        ]
        if not all(_utf8(call.function.name) and _utf8(call.function.arguments) for call in calls):
            return raw_text, []  # e.g. a name decoded from "\\ud800": no reply could carry it
        return extracted.content, calls

    def decode_with_tool_awareness(self, token_ids: Sequence[int], has_tools: bool = False) -> str:
        """Decoded text; with tools, special tokens are kept (some tokenizers make
        ``<tool_call>`` one, and the parser must see it)."""
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=not has_tools))

    # ---- inbound: OpenAI messages -> what the chat template should render ---------------

    def reconstruct_raw_text_from_tool_calls(self, tool_calls: Sequence[Any]) -> str:
        """The raw text behind ``tool_calls``: the reply they were parsed from when this
        translator handed them out, else hermes blocks written from the calls."""
        calls = [_as_dict(call) for call in tool_calls]
        if not calls:
            return ""
        exact = self.call_id_to_raw_text.get(str(calls[0].get("id")))
        if exact is not None:
            return exact
        return str(tool_calls_as_text({"role": "assistant", "tool_calls": calls})["content"])

    def convert_messages_for_template(
        self, messages: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """``messages`` with every assistant ``tool_calls`` message turned into the text the
        model wrote (its content before the calls included); other messages unchanged."""
        out: list[dict[str, Any]] = []
        for message in messages:
            if message.get("role") != "assistant" or not message.get("tool_calls"):
                out.append(dict(message))
                continue
            calls = [_as_dict(call) for call in message["tool_calls"]]
            exact = self.call_id_to_raw_text.get(str(calls[0].get("id")))
            if exact is not None:
                out.append({"role": "assistant", "content": exact})
            else:
                out.append(tool_calls_as_text({**message, "tool_calls": calls}))
        return out


def _utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _as_dict(call: Any) -> dict[str, Any]:
    if isinstance(call, Mapping):
        return dict(call)
    if hasattr(call, "model_dump"):
        return dict(call.model_dump())
    raise ValueError(f"tool_calls: expected an object with id and function, got {call!r}")
