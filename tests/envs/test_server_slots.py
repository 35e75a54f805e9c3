"""Request slots (AsyncSemWithAdaptiveWeight), Atropos-style server hooks, and routing by slots."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai.types import Completion

from atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    AsyncSemWithAdaptiveWeight,
)
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.vllm_server import VLLMServer


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("slots", "weight", "capacity"),
    [(8, 1.0, 8), (8, 0.5, 4), (8, 0.3, 2), (8, 0.01, 1), (3, 2.0, 3), (10, 0.7, 7)],
)
def test_capacity_follows_the_weight(slots: int, weight: float, capacity: int) -> None:
    sem = AsyncSemWithAdaptiveWeight(slots)
    sem.update_weight(weight)
    assert (sem.capacity, sem.free, sem.min_val()) == (capacity, capacity, slots - capacity)


async def test_waiters_are_served_in_order_when_slots_free() -> None:
    sem = AsyncSemWithAdaptiveWeight(2)
    order: list[int] = []

    async def worker(name: int, hold: asyncio.Event) -> None:
        async with sem:
            order.append(name)
            await hold.wait()

    holds = [asyncio.Event() for _ in range(4)]
    tasks = [asyncio.create_task(worker(i, holds[i])) for i in range(4)]
    await settle()
    assert order == [0, 1] and sem.locked() and sem.free == 0
    holds[1].set()
    await settle()
    assert order == [0, 1, 2]
    for hold in holds:
        hold.set()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3] and sem.free == 2 and not sem.locked()


async def test_a_lower_weight_admits_nothing_until_requests_drop_below_it() -> None:
    sem = AsyncSemWithAdaptiveWeight(4)
    for _ in range(3):
        await sem.acquire()
    sem.update_weight(0.5)  # capacity 2, three held
    assert sem.free == -1
    waiter = asyncio.create_task(sem.acquire())
    await settle()
    sem.release()
    await settle()
    assert not waiter.done(), "two held: still at capacity"
    sem.release()
    await settle()
    assert waiter.done() and sem.free == 0
    sem.update_weight(1.0)
    assert sem.free == 2


async def test_raising_the_weight_wakes_waiters() -> None:
    sem = AsyncSemWithAdaptiveWeight(4)
    sem.update_weight(0.25)
    await sem.acquire()
    waiters = [asyncio.create_task(sem.acquire()) for _ in range(2)]
    await settle()
    assert not any(w.done() for w in waiters)
    sem.update_weight(1.0)
    await settle()
    assert all(w.done() for w in waiters) and sem.free == 1


async def test_a_cancelled_waiter_leaves_no_slot_taken() -> None:
    sem = AsyncSemWithAdaptiveWeight(1)
    await sem.acquire()
    waiter = asyncio.create_task(sem.acquire())
    await settle()
    waiter.cancel()
    await settle()
    sem.release()
    assert sem.free == 1 and not sem.locked()


def test_misuse_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one slot"):
        AsyncSemWithAdaptiveWeight(0)
    sem = AsyncSemWithAdaptiveWeight(2)
    with pytest.raises(ValueError, match="weight must be a finite number > 0"):
        sem.update_weight(0.0)
    with pytest.raises(ValueError, match="released more often than acquired"):
        sem.release()


class AtroposStyleServer(APIServer):
    """A server written for Atropos 0.4: it implements the hooks, not the calls."""

    def __init__(self, config: APIServerConfig, reasoning_config: Any = None) -> None:
        super().__init__(config, reasoning_config=reasoning_config)
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        self.seen.append(("chat", kwargs))
        await self.gate.wait()
        return "chat answer"

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        self.seen.append(("completion", kwargs))
        return Completion.model_validate(
            {"id": "c", "object": "text_completion", "created": 0, "model": kwargs["model"],
             "choices": [{"index": 0, "text": "completion answer", "finish_reason": "stop"}]}
        )  # fmt: skip

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> dict[str, Any]:
        self.seen.append(("logprobs", kwargs))
        return {"prompt_tokens": [1]}


def hook_config(**extra: Any) -> APIServerConfig:
    return APIServerConfig(model_name="m", base_url="http://127.0.0.1:9/v1", **extra)


async def test_atropos_hooks_get_the_model_and_are_timed_per_split() -> None:
    server = AtroposStyleServer(hook_config())
    assert await server.chat_completion(messages=[], n=2) == "chat answer"
    answer = await server.completion(prompt="p", split="eval")
    assert answer.choices[0].text == "completion answer"
    assert await server.get_logprobs(prompt="p", top_k=3) == {"prompt_tokens": [1]}
    assert server.seen == [
        ("chat", {"messages": [], "n": 2, "model": "m"}),
        ("completion", {"prompt": "p", "model": "m"}),
        ("logprobs", {"prompt": "p", "top_k": 3, "model": "m"}),
    ]
    assert len(server.request_timings) == 2 and list(server.attempts_list) == [1, 1]
    assert len(server.eval_request_timings) == 1 and list(server.eval_attempts_list) == [1]
    await server.close()


async def test_a_hook_holds_a_slot_while_it_runs() -> None:
    server = AtroposStyleServer(hook_config(num_max_requests_at_once=1))
    server.gate.clear()
    first = asyncio.create_task(server.chat_completion(messages=[]))
    second = asyncio.create_task(server.chat_completion(messages=[]))
    await settle()
    assert len(server.seen) == 1 and server.free_slots("train") == 0
    server.gate.set()
    await asyncio.gather(first, second)
    assert len(server.seen) == 2 and server.free_slots("train") == 1
    await server.close()


async def test_a_server_without_calls_or_hooks_says_so() -> None:
    server = APIServer(hook_config())
    with pytest.raises(NotImplementedError, match="overrides neither chat_completion nor"):
        await server.chat_completion(messages=[])
    await server.close()


async def test_server_healthy_false_takes_a_server_out_of_rotation() -> None:
    manager = ServerManager([hook_config(), hook_config()], server_class=AtroposStyleServer)
    sick, well = manager.servers
    assert isinstance(sick, AtroposStyleServer) and isinstance(well, AtroposStyleServer)
    sick.server_healthy = False
    for _ in range(5):
        await manager.completion(prompt="x")
    assert not sick.seen and len(well.seen) == 5
    sick.server_healthy, well.server_healthy = True, False
    await manager.completion(prompt="x")
    assert len(sick.seen) == 1 and len(well.seen) == 5, "back in rotation, the other out"
    await manager.close()


class ForeignServer:
    """Not an APIServer at all: only Atropos's routing attributes and one call."""

    def __init__(self, name: str, train: int, evals: int, healthy: bool = True) -> None:
        self.name, self.server_healthy, self.calls = name, healthy, 0
        self.sem, self.eval_sem = AsyncSemWithAdaptiveWeight(train), AsyncSemWithAdaptiveWeight(8)
        self.eval_sem.update_weight(evals / 8)

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        return {"server": self.name, **kwargs}


async def test_the_manager_routes_by_free_slots_and_health_of_any_server() -> None:
    a, b, c = ForeignServer("a", 2, 8), ForeignServer("b", 6, 2), ForeignServer("c", 8, 8, False)
    manager = ServerManager.__new__(ServerManager)
    manager.servers = [a, b, c]  # type: ignore[list-item]
    assert (await manager.get_logprobs(prompt="x"))["server"] == "b"
    answer = await manager.get_logprobs(prompt="y", split="eval")
    assert answer == {"server": "a", "prompt": "y", "split": "eval"}


def test_naming_the_base_apiserver_picks_the_backend_by_server_type() -> None:
    config = APIServerConfig(base_url="http://127.0.0.1:9/v1", server_type="vllm")
    manager = ServerManager([config], server_class=APIServer)
    assert type(manager.servers[0]) is VLLMServer


async def test_the_manager_keeps_the_split_of_logprob_requests() -> None:
    manager = ServerManager([hook_config()], server_class=AtroposStyleServer)
    (server,) = manager.servers
    await manager.get_logprobs(prompt="p", split="eval")
    await manager.get_logprobs(prompt="q")
    assert len(server.eval_request_timings) == 1 and len(server.request_timings) == 1
    await manager.close()
