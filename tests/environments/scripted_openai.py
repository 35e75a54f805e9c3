"""A scripted OpenAI-compatible server: ``python scripted_openai.py --port N --script FILE``.

The script is a JSON list of rules ``{"when": "substring", "replies": ["...", ...]}``. A request
takes the first rule whose ``when`` occurs in its last user message (chat) or prompt
(completions); choice ``i`` of ``n`` gets ``replies[(k + i) % len(replies)]``, where ``k`` counts
earlier choices served by that rule, so a rule walks through its replies. ``GET /requests``
returns every request body received.

With ``--tokenizer FOLDER`` it also answers SGLang's ``POST /generate`` (token ids in and out,
what the catalogue envs use): the prompt ids are decoded to find the last user turn (ChatML),
the reply is encoded and ends with the end-of-turn id, cut at ``max_new_tokens`` (finish
reason ``length``). ``GET /sampled`` returns every sequence served there: prompt and output ids.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException, Request

app = FastAPI()
state: dict[str, Any] = {
    "rules": [],
    "served": {},
    "requests": [],
    "sampled": [],
    "tokenizer": None,
}


def _replies(text: str, n: int) -> list[str]:
    for index, rule in enumerate(state["rules"]):
        if rule.get("when", "") in text:
            served = state["served"].get(index, 0)
            state["served"][index] = served + n
            replies = rule["replies"]
            return [replies[(served + i) % len(replies)] for i in range(n)]
    raise HTTPException(400, detail=f"no scripted rule matches: {text[-200:]!r}")


def _last_user(messages: list[dict[str, Any]]) -> str:
    users = [m for m in messages if m.get("role") == "user"]
    content = users[-1]["content"] if users else ""
    return content if isinstance(content, str) else json.dumps(content)


@app.get("/requests")
async def requests() -> list[dict[str, Any]]:
    return state["requests"]  # type: ignore[no-any-return]


@app.get("/v1/models")
async def models() -> dict[str, Any]:
    return {"object": "list", "data": [{"id": "scripted", "object": "model"}]}


@app.post("/v1/chat/completions")
async def chat(request: Request) -> dict[str, Any]:
    body = await request.json()
    state["requests"].append(body)
    replies = _replies(_last_user(body["messages"]), int(body.get("n") or 1))
    choices = [
        {"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
        for i, text in enumerate(replies)
    ]
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return {"id": "s", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": choices, "usage": usage}  # fmt: skip


@app.post("/v1/completions")
async def completions(request: Request) -> dict[str, Any]:
    body = await request.json()
    state["requests"].append(body)
    prompt = body["prompt"] if isinstance(body["prompt"], str) else json.dumps(body["prompt"])
    replies = _replies(prompt, int(body.get("n") or 1))
    choices = [{"index": i, "finish_reason": "stop", "text": t} for i, t in enumerate(replies)]
    return {"id": "s", "object": "text_completion", "created": 0, "model": body["model"],
            "choices": choices}  # fmt: skip


def _last_user_turn(prompt: str) -> str:
    turns = [part for part in prompt.split("<|im_start|>") if part.startswith("user\n")]
    return turns[-1].removeprefix("user\n").split("<|im_end|>")[0] if turns else prompt


@app.post("/generate")
async def generate(request: Request) -> Any:
    body = await request.json()
    state["requests"].append(body)
    tokenizer = state["tokenizer"]
    params = body.get("sampling_params") or {}
    prompt_ids = body["input_ids"]
    texts = _replies(_last_user_turn(tokenizer.decode(prompt_ids)), int(params.get("n") or 1))
    limit = int(params.get("max_new_tokens") or 128)
    out = []
    for text in texts:
        ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        reason = {"type": "length"} if len(ids) > limit else {"type": "stop"}
        ids = ids[:limit]
        state["sampled"].append({"prompt_ids": prompt_ids, "output_ids": ids})
        logprobs = [[-0.5, t, None] for t in ids]
        meta = {"output_token_logprobs": logprobs, "finish_reason": reason,
                "prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                "weight_version": 0}  # fmt: skip
        out.append({"text": tokenizer.decode(ids), "output_ids": ids, "meta_info": meta})
    return out[0] if len(out) == 1 else out


@app.get("/sampled")
async def sampled() -> list[dict[str, Any]]:
    return state["sampled"]  # type: ignore[no-any-return]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--tokenizer", type=str, default=None)
    args = parser.parse_args()
    state["rules"] = json.loads(args.script.read_text())
    if args.tokenizer:
        from transformers import AutoTokenizer

        state["tokenizer"] = AutoTokenizer.from_pretrained(args.tokenizer)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
