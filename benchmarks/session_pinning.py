"""Five-turn tool episodes against two embedded servers: each turn's prefill time and
prefix-cache hits when a ``managed_server()`` session keeps every turn on the server of its
first turn ("pinned"), and when each turn is routed to the least-loaded server anew, as before
issue 59 ("unpinned").

Every session runs turn 1, then turn 2, ... in lock step with the others, and the two servers'
``/health`` counters (``prefill_seconds``, ``prompt_tokens``, ``prompt_tokens_reused``) are read
between turns, so each turn's figures are those of that turn alone. Both modes run in one
process against the same two servers, one after the other, each on fresh conversations.

    .venv/bin/python benchmarks/session_pinning.py                 # 8 sessions x 5 turns, ~5 min
    .venv/bin/python benchmarks/session_pinning.py --sessions 2 --turns 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.utils.test_model import test_model_dir
from benchmarks.machine import cpu_facts
from benchmarks.serving import start_embedded

SYSTEM = (
    "You are a shop assistant. You can call the tool `price(item)` that returns an item's "
    "price in dollars, and `calculate(expression)` that evaluates arithmetic. Call a tool by "
    'writing <tool_call>{"name": ..., "arguments": {...}}</tool_call>; answer when you know.'
)
QUESTIONS = [
    "How much do three apples and two pears cost?",
    "What is the price of a kettle plus a toaster?",
    "If a lamp costs twice a chair, what do both cost?",
    "How much are five notebooks and a pen?",
    "What do a bicycle and a helmet cost together?",
    "How much are four cups and a teapot?",
    "What is the total for two shirts and a tie?",
    "How much do a desk and two chairs cost?",
]
COUNTERS = ("prefill_seconds", "prompt_tokens", "prompt_tokens_reused")


async def counters(client: httpx.AsyncClient, urls: list[str]) -> list[dict[str, float]]:
    answers = [(await client.get(f"{url}/health")).json() for url in urls]
    return [{name: float(answer[name]) for name in COUNTERS} for answer in answers]


async def run_mode(
    mode: str, urls: list[str], tokenizer: Any, sessions: int, turns: int, max_tokens: int
) -> list[dict[str, Any]]:
    """One row per turn: the summed figures of both servers over that turn of every session,
    and where the sessions' turns ran."""
    configs = [
        APIServerConfig(
            base_url=f"{url}/v1", model_name="smol", server_type="embedded", api_key="bench"
        )
        for url in urls
    ]
    manager = ServerManager(configs)
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=60) as client:
        blocks = [manager.managed_server(tokenizer=tokenizer) for _ in range(sessions)]
        if mode == "pinned":
            managed = [await block.__aenter__() for block in blocks]
        else:  # the manager itself as the backend: every turn routed anew
            managed = [ManagedServer(manager, tokenizer=tokenizer) for _ in range(sessions)]
        chats = [
            [
                {"role": "system", "content": SYSTEM},
                # the mode in the question: no conversation of the other run is continued
                {"role": "user", "content": f"({mode}) {QUESTIONS[i % len(QUESTIONS)]}"},
            ]
            for i in range(sessions)
        ]
        for turn in range(1, turns + 1):
            before = await counters(client, urls)
            started = time.perf_counter()
            replies = await asyncio.gather(
                *(
                    m.chat_completion(messages=chat, max_tokens=max_tokens, temperature=1.0)
                    for m, chat in zip(managed, chats, strict=True)
                )
            )
            wall = time.perf_counter() - started
            after = await counters(client, urls)
            for chat, reply in zip(chats, replies, strict=True):
                chat += [
                    {"role": "assistant", "content": reply.choices[0].message.content or ""},
                    {"role": "user", "content": f"Tool result for turn {turn}: 12.50"},
                ]
            delta = {
                name: sum(a[name] - b[name] for a, b in zip(after, before, strict=True))
                for name in COUNTERS
            }
            per_server = [
                a["prompt_tokens"] - b["prompt_tokens"] for a, b in zip(after, before, strict=True)
            ]
            rows.append(
                {
                    "mode": mode,
                    "turn": turn,
                    "wall_s": round(wall, 3),
                    "prefill_s": round(delta["prefill_seconds"], 3),
                    "prompt_tokens": int(delta["prompt_tokens"]),
                    "reused_tokens": int(delta["prompt_tokens_reused"]),
                    "hit_share": round(
                        delta["prompt_tokens_reused"] / max(1, delta["prompt_tokens"]), 3
                    ),
                    "prompt_tokens_per_server": [int(t) for t in per_server],
                }
            )
        if mode == "pinned":
            servers = [m.server.server for m in managed]
            rows[-1]["sessions_per_server"] = [
                sum(s is x for s in servers) for x in manager.servers
            ]
            rows[-1]["moves"] = sum(len(m.server.moves) for m in managed)
            for block in blocks:
                await block.__aexit__(None, None, None)
    await manager.close()
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    later = {
        mode: [r for r in rows if r["mode"] == mode and r["turn"] > 1]
        for mode in ("pinned", "unpinned")
    }
    total = {
        mode: {k: sum(r[k] for r in rs) for k in ("prefill_s", "prompt_tokens", "reused_tokens")}
        for mode, rs in later.items()
    }
    return {
        "turns_2_on": total,
        "hit_share": {
            mode: round(t["reused_tokens"] / max(1, t["prompt_tokens"]), 3)
            for mode, t in total.items()
        },
        "prefill_ratio_unpinned_over_pinned": round(
            total["unpinned"]["prefill_s"] / max(1e-9, total["pinned"]["prefill_s"]), 2
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per server")
    parser.add_argument("--model", type=Path, default=None, help="default: the test model")
    parser.add_argument("--json", type=Path, default=None, help="write rows and summary here")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    model = args.model or test_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    extra = ("--api-key", "bench")
    started = [start_embedded(model, args.threads, 16, extra=extra) for _ in range(2)]
    try:
        urls = [url for _, url in started]
        rows: list[dict[str, Any]] = []
        for mode in ("pinned", "unpinned"):
            rows += asyncio.run(
                run_mode(mode, urls, tokenizer, args.sessions, args.turns, args.max_tokens)
            )
    finally:
        for process, _ in started:
            process.terminate()
            process.wait(timeout=30)
    print(f"cpu: {json.dumps(cpu_facts())}")
    print(
        f"{'mode':9} {'turn':>4} {'prefill s':>9} {'prompt tok':>10} {'reused':>7} "
        f"{'hit share':>9} {'wall s':>7}  per server"
    )
    for r in rows:
        print(
            f"{r['mode']:9} {r['turn']:>4} {r['prefill_s']:>9.3f} {r['prompt_tokens']:>10} "
            f"{r['reused_tokens']:>7} {r['hit_share']:>9.3f} {r['wall_s']:>7.2f}  "
            f"{r['prompt_tokens_per_server']}"
        )
    result = summary(rows)
    print(json.dumps(result))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "summary": result,
                    "cpu": cpu_facts(),
                    "args": {k: str(v) for k, v in vars(args).items()},
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
