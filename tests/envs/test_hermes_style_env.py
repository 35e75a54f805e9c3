"""An env written the way hermes-agent writes its RL environments (``hermes_style/``) runs
``process`` against the embedded server with the real model, on the managed path (the server
is no OpenAIServer): each sequence is the engine's own ids with its logprobs, checked against
the server's sample log (exact, as for our shipped envs), and the model's tool calls come
back parsed (``message.tool_calls``) and answered with ``tool`` messages."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from envs_testlib import child_env

from atroposlib.inference.sample_log import read_sample_log, trained_spans

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inference"))
from inference_helpers import RunningServer, start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.model]
ENV_FILE = Path(__file__).parent / "hermes_style" / "tool_agent_env.py"


@pytest.fixture(scope="module")
def logged_server(
    test_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningServer, Path]]:
    folder = tmp_path_factory.mktemp("hermes_style")
    log = folder / "sampled.jsonl"
    server = start_server(test_model_path, child_env(), folder / "server.log", "--threads", "1",
                          "--sample-log", str(log))  # fmt: skip
    yield server, log
    stop_server(server)


def process(server: RunningServer, tmp: Path, *flags: str) -> list[dict[str, Any]]:
    out = tmp / "groups.jsonl"
    args = [sys.executable, str(ENV_FILE), "process", f"--openai.base_url={server.url}/v1",
            f"--openai.model_name={server.name}", "--openai.server_type=embedded",
            f"--env.tokenizer_name={server.model_path}", "--env.total_steps=1",
            f"--env.data_path_to_save_groups={out}", *flags]  # fmt: skip
    done = subprocess.run(args, cwd=tmp, env=child_env(), capture_output=True, text=True,
                          timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_the_managed_path_trains_on_the_engine_s_ids_and_logprobs_with_parsed_tool_calls(
    logged_server: tuple[RunningServer, Path], tmp_path: Path
) -> None:
    server, log = logged_server
    (row,) = process(server, tmp_path)
    # Both replies of the group are greedy, so the same ids can be sampled twice; the second
    # computation may reuse the first's prompt cache and round differently (~3e-7): each trained
    # span must equal one of the samplings exactly.
    served: dict[tuple[tuple[int, ...], tuple[int, ...]], list[list[float]]] = {}
    for r in read_sample_log(log):
        served.setdefault((tuple(r["prompt_ids"]), tuple(r["output_ids"])), []).append(
            r["logprobs"]
        )
    assert len(row["tokens"]) == 2 and row["scores"] == [1.0, 1.0]
    for tokens, masks, logprobs, chat in zip(
        row["tokens"], row["masks"], row["inference_logprobs"], row["messages"], strict=True
    ):
        spans = trained_spans(masks)
        assert len(spans) == 2, "both agent turns trained, in one sequence"
        for start, end in spans:
            key = (tuple(tokens[:start]), tuple(tokens[start:end]))
            assert key in served, "trained ids are an output sampled right after these ids"
            assert logprobs[start:end] in served[key] and masks[start:end] == tokens[start:end]
        assert spans[-1][1] == len(tokens), "nothing follows the last sampled reply"
        trained = {p for start, end in spans for p in range(start, end)}
        assert all(logprobs[p] == 1.0 for p in range(len(tokens)) if p not in trained)
        calls = [m["tool_calls"][0]["function"] for m in chat if m.get("tool_calls")]
        assert calls[0] == {"name": "search", "arguments": '{"q": "birds"}'}
        assert [m["role"] for m in chat].count("tool") == len(calls)
