"""sample_group / sample_replies / greedy_reply: the sampling call, scoring and stacking."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from atroposlib.utils.chat_group import chat_group, greedy_reply, sample_group, sample_replies
from atroposlib.utils.test_model import ensure_test_model

PROMPT = [{"role": "user", "content": "2 + 2?"}]


class RecordingServer:
    """Answers every request with the given replies and remembers its kwargs (a unit fake)."""

    def __init__(self, replies: list[tuple[str, str]]) -> None:
        self.replies = replies
        self.calls: list[dict[str, Any]] = []

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        self.calls.append(kwargs)
        choices = [
            {"index": i, "finish_reason": reason,
             "message": {"role": "assistant", "content": text}}
            for i, (text, reason) in enumerate(self.replies[: kwargs["n"]])
        ]  # fmt: skip
        return ChatCompletion.model_validate(
            {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": choices}
        )


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(ensure_test_model()))


async def test_sample_group_scores_each_reply_and_trains_only_the_reply(tokenizer: Any) -> None:
    server = RecordingServer([("4", "stop"), ("5", "stop"), ("four", "length")])
    group = await sample_group(
        server, tokenizer, PROMPT, lambda replies: [float(r == "4") for r in replies],
        n=3, max_tokens=16, temperature=0.7,
    )  # fmt: skip
    assert server.calls == [{"messages": PROMPT, "n": 3, "max_tokens": 16, "temperature": 0.7}]
    assert group["scores"] == [1.0, 0.0, 0.0]
    assert [m[-1] for m in group["messages"]] == [
        {"role": "assistant", "content": text} for text in ("4", "5", "four")
    ]
    trained = [tokenizer.decode([t for t in m if t != -100]) for m in group["masks"]]
    assert trained[0].startswith("4") and trained[1].startswith("5")
    expected = chat_group(
        tokenizer,
        [[*PROMPT, {"role": "assistant", "content": t}] for t in ("4", "5", "four")],
        [1.0, 0.0, 0.0],
        finish_reasons=["stop", "stop", "length"],
    )
    assert group == expected


async def test_sample_group_awaits_an_async_scorer(tokenizer: Any) -> None:
    async def score(replies: list[str]) -> list[float]:
        return [len(r) / 10 for r in replies]

    server = RecordingServer([("four", "stop"), ("4", "stop")])
    group = await sample_group(server, tokenizer, PROMPT, score, n=2, max_tokens=8)
    assert group["scores"] == [0.4, 0.1]
    assert "temperature" not in server.calls[0]  # None leaves the server's default


async def test_greedy_reply_uses_eval_capacity_at_temperature_zero() -> None:
    server = RecordingServer([("4", "stop")])
    assert await greedy_reply(server, PROMPT, max_tokens=5) == "4"
    assert server.calls[0] == {"messages": PROMPT, "n": 1, "max_tokens": 5,
                               "temperature": 0.0, "split": "eval"}  # fmt: skip


async def test_sample_replies_keeps_finish_reasons_and_builds_chats() -> None:
    server = RecordingServer([("a", "stop"), ("b", "length")])
    replies = await sample_replies(server, PROMPT, n=2, max_tokens=3)
    assert replies.texts == ["a", "b"] and replies.finish_reasons == ["stop", "length"]
    assert replies.chats()[1] == [*PROMPT, {"role": "assistant", "content": "b"}]


def test_chat_group_needs_one_score_per_chat(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="one score per chat"):
        chat_group(tokenizer, [PROMPT], [1.0, 0.0])
