"""One session, one server (Atropos #442, #443): the turns of a ``managed_server()`` block and
of a proxy session go to the server of their first turn; they move only when it fails, and the
nodes (and the trajectory) sampled after the move say so."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from atroposlib.envs.rollouts import trajectory_group
from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    GeneratedSequence,
)
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.errors import InferenceError
from atroposlib.proxy.client import node_trajectory
from atroposlib.proxy.session import SessionRecorder
from tests.fakes import ChatCharTokenizer

URLS = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
TURNS = 5


class TokenServer(APIServer):
    """Answers every ``generate`` with ``n`` replies of "ok"; ``failing``: raises instead
    (``failures_left`` times, or for good with -1)."""

    supports_token_ids = True

    def __init__(self, config: APIServerConfig, reasoning_config: Any = None) -> None:
        super().__init__(config, reasoning_config=reasoning_config)
        self.prompts: list[list[int]] = []
        self.failures_left = 0

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]:
        if self.failures_left:
            self.failures_left -= 1
            raise InferenceError(f"{self.config.base_url}: connection refused")
        self.prompts.append(list(input_ids))
        return [GeneratedSequence([ord("o"), ord("k")], [-0.1, -0.2], "stop") for _ in range(n)]


def two_servers(max_retries: int = 0) -> ServerManager:
    configs = [APIServerConfig(model_name="m", base_url=url, max_retries=max_retries,
                               retry_backoff_s=0.01) for url in URLS]  # fmt: skip
    return ServerManager(configs, server_class=TokenServer)


def server(manager: ServerManager, index: int) -> TokenServer:
    found = manager.servers[index]
    assert isinstance(found, TokenServer)
    return found


async def five_turns(managed: Any, before_turn: Any = None) -> list[Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "start"}]
    for turn in range(1, TURNS + 1):
        if before_turn is not None:
            before_turn(turn)
        reply = await managed.chat_completion(messages=messages, max_tokens=4)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "tool", "content": f"result {turn}"}]  # fmt: skip
    return list(managed.get_state()["nodes"])


async def test_every_turn_of_every_session_goes_to_the_server_of_its_first_turn() -> None:
    manager = two_servers()
    firsts = []
    for _ in range(8):
        seen_before = [len(server(manager, i).prompts) for i in (0, 1)]
        async with manager.managed_server(tokenizer=ChatCharTokenizer()) as managed:
            [node] = await five_turns(managed)
        added = [len(server(manager, i).prompts) - seen_before[i] for i in (0, 1)]
        assert sorted(added) == [0, TURNS], f"turns per server: {added}"
        first = added.index(TURNS)
        firsts.append(first)
        assert node.metadata == {"finish_reason": "stop", "server": URLS[first]}
        prompts = server(manager, first).prompts[-TURNS:]  # each turn continues the last one
        assert all(b[: len(a)] == a for a, b in itertools.pairwise(prompts))
    assert set(firsts) == {0, 1}  # sessions still spread over the servers
    await manager.close()


async def test_a_session_moves_only_when_its_server_fails_and_its_nodes_say_so() -> None:
    manager = two_servers()
    where: list[int] = []

    def fail_third_turn(turn: int) -> None:
        if turn == 3:
            first = 0 if server(manager, 0).prompts else 1
            where.append(first)
            server(manager, first).failures_left = -1  # down for good

    async with manager.managed_server(tokenizer=ChatCharTokenizer()) as managed:
        [node] = await five_turns(managed, fail_third_turn)
    [first] = where
    other = 1 - first
    assert len(server(manager, first).prompts) == 2  # turns 1 and 2
    assert len(server(manager, other).prompts) == 3  # turns 3, 4 and 5: it stayed there
    assert node.metadata is not None
    assert node.metadata["server"] == URLS[other]
    [move] = node.metadata["server_moves"]
    assert move["turn"] == 3 and move["from"] == URLS[first] and move["to"] == URLS[other]
    assert "connection refused" in move["reason"]
    await manager.close()


async def test_a_failure_the_retries_cover_does_not_move_the_session() -> None:
    manager = two_servers(max_retries=2)

    def blip(turn: int) -> None:
        if turn == 2:
            server(manager, 0 if server(manager, 0).prompts else 1).failures_left = 1

    async with manager.managed_server(tokenizer=ChatCharTokenizer()) as managed:
        [node] = await five_turns(managed, blip)
    assert sorted(len(server(manager, i).prompts) for i in (0, 1)) == [0, TURNS]
    assert node.metadata is not None and "server_moves" not in node.metadata
    await manager.close()


async def test_a_block_pinned_by_base_url_stays_there_and_fails_when_it_does() -> None:
    manager = two_servers()
    server(manager, 1).failures_left = -1
    async with manager.managed_server(tokenizer=ChatCharTokenizer(), base_url=URLS[1]) as managed:
        with pytest.raises(InferenceError, match="connection refused"):
            await managed.chat_completion(messages=[{"role": "user", "content": "x"}])
    assert server(manager, 0).prompts == []
    await manager.close()


async def test_a_proxy_session_moves_when_its_server_fails_and_the_group_records_it() -> None:
    manager = two_servers()
    first, spare = server(manager, 0), server(manager, 1)
    recorder = SessionRecorder(first, ChatCharTokenizer(), "hermes", attempts=2,
                               spare=lambda failed: spare if failed is first else None)  # fmt: skip

    def fail_second_turn(turn: int) -> None:
        if turn == 2:
            first.failures_left = -1

    [node] = await five_turns(recorder, fail_second_turn)
    assert len(first.prompts) == 1 and len(spare.prompts) == TURNS - 1
    assert node.metadata is not None and node.metadata["server"] == URLS[1]
    [move] = node.metadata["server_moves"]
    assert (move["turn"], move["from"], move["to"]) == (2, URLS[0], URLS[1])
    group = trajectory_group([node_trajectory(node, [])], [1.0])
    assert group.extra == [{"server_moves": [move]}]
    unmoved = trajectory_group([node_trajectory(node.model_copy(update={"metadata": {}}), [])],
                               [1.0])  # fmt: skip
    assert unmoved.extra is None  # a group that never moved is written as before
    await manager.close()


async def test_a_proxy_session_with_no_spare_fails_on_its_own_server() -> None:
    manager = two_servers()
    first = server(manager, 0)
    first.failures_left = -1
    recorder = SessionRecorder(first, ChatCharTokenizer(), "hermes", attempts=1)
    with pytest.raises(InferenceError, match="connection refused"):
        await recorder.chat_completion(messages=[{"role": "user", "content": "x"}])
    assert server(manager, 1).prompts == []
    await manager.close()


async def test_new_sessions_go_to_the_server_holding_fewest_open_sessions() -> None:
    manager = two_servers()
    blocks = [manager.managed_server(tokenizer=ChatCharTokenizer()) for _ in range(6)]
    opened = [await block.__aenter__() for block in blocks]
    for managed in opened:  # one turn each, one after another: no slot is held between them
        await managed.chat_completion(messages=[{"role": "user", "content": "hi"}])
    assert [len(server(manager, i).prompts) for i in (0, 1)] == [3, 3]
    for block in blocks[:3]:
        await block.__aexit__(None, None, None)
    assert sorted(manager.sessions_on.values()) == [1, 2]
    for block in blocks[3:]:
        await block.__aexit__(None, None, None)
    assert sum(manager.sessions_on.values()) == 0
    await manager.close()
