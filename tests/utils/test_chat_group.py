"""chat_group: written chats (SFT rows) tokenized into a typed group."""

from __future__ import annotations

from typing import Any

import pytest

from atroposlib.utils.chat_group import chat_group
from atroposlib.utils.test_model import ensure_test_model

PROMPT = [{"role": "user", "content": "2 + 2?"}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ensure_test_model()))


def test_chat_group_trains_the_assistant_turns_and_keeps_overrides(tokenizer: Any) -> None:
    chats = [[*PROMPT, {"role": "assistant", "content": text}] for text in ("4", "five")]
    group = chat_group(
        tokenizer, chats, [1, 0], overrides=[{"sft": True}, {"sft": True}],
        group_overrides={"sft": True, "group_size": 2},
    )  # fmt: skip
    trained = [tokenizer.decode([t for t in m if t != -100]) for m in group.masks]
    assert trained[0].startswith("4") and trained[1].startswith("five")
    assert group.scores == [1.0, 0.0] and group.override(0, "sft") is True
    assert group.group_overrides is not None and group.group_overrides.group_size == 2
    assert group.messages is not None and group.messages[1][-1].content == "five"
    assert group.inference_logprobs is None, "nobody sampled these ids"


def test_chat_group_needs_one_score_per_chat(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="one score per chat"):
        chat_group(tokenizer, [PROMPT], [1.0, 0.0])
