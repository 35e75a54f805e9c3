"""A server that returns fewer choices than it was asked for (Atropos's users met one that
ignores ``n``): the manager asks it again for the rest, or the call fails with an error naming
the server and the counts; a group never comes back short without a word."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types import Completion

from atroposlib.envs.server_handling.choices import SHORT_ANSWER_ASKS
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    GeneratedSequence,
)
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.errors import InferenceUnavailableError

URL = "http://127.0.0.1:9/v1"


class ShortServer(APIServer):
    """Answers every request with at most ``per_request`` choices, whatever ``n`` says
    (``ignore_n``: exactly ``per_request``, more than asked too)."""

    per_request = 1
    ignore_n = False
    supports_token_ids = True

    def __init__(self, config: APIServerConfig, reasoning_config: Any = None) -> None:
        super().__init__(config, reasoning_config=reasoning_config)
        self.asked: list[int] = []

    async def _completion_wrapper(self, **kwargs: Any) -> Completion:
        n = int(kwargs.get("n") or 1)
        self.asked.append(n)
        given = self.per_request if self.ignore_n else min(n, self.per_request)
        choices = [{"index": 0, "text": f"answer {len(self.asked)}.{i}", "finish_reason": "stop"}
                   for i in range(given)]  # fmt: skip
        return Completion.model_validate(
            {"id": "c", "object": "text_completion", "created": 0, "model": "m",
             "choices": choices}
        )  # fmt: skip

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        self.asked.append(n)
        return [GeneratedSequence([7], [-0.1], "stop") for _ in range(min(n, self.per_request))]


def manager(per_request: int, ignore_n: bool = False, **config: Any) -> ServerManager:
    ShortServer.per_request, ShortServer.ignore_n = per_request, ignore_n
    settings = APIServerConfig(model_name="m", base_url=URL, max_retries=0, **config)
    return ServerManager([settings], server_class=ShortServer)


async def test_a_server_that_ignores_n_is_asked_again_for_the_rest() -> None:
    servers = manager(per_request=1)
    answer = await servers.completion(prompt="p", n=3)
    assert len(answer.choices) == 3
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert len({c.text for c in answer.choices}) == 3  # three requests, not one answer thrice
    assert servers.servers[0].asked == [3, 2, 1]  # type: ignore[attr-defined]


async def test_a_server_that_keeps_answering_short_fails_the_call_naming_it_and_the_counts() -> (
    None
):
    servers = manager(per_request=0)
    with pytest.raises(InferenceUnavailableError) as failed:
        await servers.completion(prompt="p", n=4)
    message = str(failed.value)
    assert URL in message and "0 of the 4 choices" in message
    assert "n_kwarg_is_ignored" in message  # the fix for a server that ignores n
    assert servers.servers[0].asked == [4] * SHORT_ANSWER_ASKS  # type: ignore[attr-defined]


async def test_token_sampling_gets_every_sequence_too() -> None:
    servers = manager(per_request=2)
    sequences = await servers.generate([1, 2], 5, {})
    assert len(sequences) == 5
    assert servers.servers[0].asked == [5, 3, 1]  # type: ignore[attr-defined]


async def test_a_managed_server_pinned_to_a_url_gets_every_sequence() -> None:
    servers = manager(per_request=1)
    async with servers.managed_server(tokenizer=object(), base_url=URL) as managed:
        sequences = await managed.server.generate([1], 2, {})
    assert len(sequences) == 2
    assert servers.servers[0].asked == [2, 1]  # type: ignore[attr-defined]


async def test_extra_choices_are_not_kept() -> None:
    servers = manager(per_request=8, ignore_n=True)
    answer = await servers.completion(prompt="p", n=2)
    assert [c.text for c in answer.choices] == ["answer 1.0", "answer 1.1"]
