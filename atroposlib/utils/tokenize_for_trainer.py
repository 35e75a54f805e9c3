"""Turn a chat into ``tokens`` and ``masks`` for the trainer (Atropos 0.4 signature)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from atroposlib.group import MASK_IGNORE_INDEX
from atroposlib.type_definitions import Message

logger = logging.getLogger(__name__)

TRAINED_ROLES = ("assistant", "agent")
UNMASKED_ROLES = list(TRAINED_ROLES)
"""Atropos 0.4's name for the roles trained by default."""


def with_list_chat_template(tokenizer: Any) -> Any:
    """Make ``tokenizer.apply_chat_template(chat)`` return a list of ids again, as in
    transformers 4 (5 returns a ``BatchEncoding`` unless ``return_dict=False``), so env code
    written for Atropos 0.4 that takes ``len()`` of it or stores it as tokens keeps working.
    Only this tokenizer object changes; ``return_dict=True`` still gets the mapping."""
    original = tokenizer.apply_chat_template
    if getattr(original, "_returns_lists", False):
        return tokenizer

    def apply_chat_template(conversation: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(conversation, *args, **kwargs)
        if kwargs.get("return_dict") or not kwargs.get("tokenize", True):
            return result
        if hasattr(result, "keys") and "input_ids" in result:
            return list(result["input_ids"])
        return result

    apply_chat_template._returns_lists = True  # type: ignore[attr-defined]
    tokenizer.apply_chat_template = apply_chat_template
    return tokenizer


def _template(tokenizer: Any, chat: Sequence[Message], *, generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(
        list(chat), tokenize=True, add_generation_prompt=generation_prompt
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def tokenize_for_trainer(
    tokenizer: Any,
    chat: Sequence[Message],
    include_messages: bool = False,
    train_on_all_assistant_turns: bool = False,
    finish_reason: str = "",
    unmasked_role: str | None = None,
) -> dict[str, Any]:
    """Tokenize ``chat`` with the tokenizer's chat template and mask what is not trained.

    By default only the last message is trained (everything before it, including the
    generation prompt, is masked with -100). With ``train_on_all_assistant_turns`` every
    assistant (or ``agent``, or ``unmasked_role``) turn is trained. A completion cut off by
    ``finish_reason == "length"`` loses a trailing end-of-sequence token the template added.

    Returns ``{"tokens", "masks"}`` plus ``"messages"`` when ``include_messages``.
    """
    tokens = _template(tokenizer, chat, generation_prompt=False)
    masks = [MASK_IGNORE_INDEX] * len(tokens)
    if train_on_all_assistant_turns:
        roles = (*TRAINED_ROLES, unmasked_role) if unmasked_role else TRAINED_ROLES
        spans = [
            (
                len(_template(tokenizer, chat[:index], generation_prompt=True)),
                len(_template(tokenizer, chat[: index + 1], generation_prompt=False)),
            )
            for index, message in enumerate(chat)
            if message["role"] in roles
        ]
    else:
        spans = [(len(_template(tokenizer, chat[:-1], generation_prompt=True)), len(tokens))]
    for start, end in spans:
        masks[start:end] = tokens[start:end]
    if finish_reason == "length" and tokens and tokens[-1] == tokenizer.eos_token_id:
        tokens, masks = tokens[:-1], masks[:-1]
    result: dict[str, Any] = {"tokens": tokens, "masks": masks}
    if include_messages:
        result["messages"] = list(chat)
    return result
