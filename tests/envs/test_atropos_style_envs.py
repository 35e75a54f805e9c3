"""Atropos-style environment files (``tests/envs/atropos_style/``) run ``process`` against the
embedded inference server with the real small model: the reward registry, a dedicated
server, the managed-server path with tools and a token-id stop, and teacher distillation."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from envs_testlib import child_env

from atroposlib.envs.reward_fns import CombinedReward, registry
from atroposlib.utils.tool_call_parser import parse_tool_call

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inference"))
from inference_helpers import RunningServer

pytestmark = [pytest.mark.slow, pytest.mark.model]
ENVS = Path(__file__).parent / "atropos_style"


def process(env_file: str, server: RunningServer, tmp: Path, *flags: str) -> list[dict[str, Any]]:
    out = tmp / "groups.jsonl"
    args = [
        sys.executable, str(ENVS / env_file), "process",
        f"--openai.base_url={server.url}/v1", f"--openai.model_name={server.name}",
        f"--env.tokenizer_name={server.model_path}", "--env.total_steps=1",
        f"--env.data_path_to_save_groups={out}", *flags,
    ]  # fmt: skip
    done = subprocess.run(args, cwd=tmp, env=child_env(), capture_output=True, text=True,
                          timeout=400)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_reward_registry_scores_the_rows(smol: RunningServer, tmp_path: Path) -> None:
    (row,) = process("reward_registry_env.py", smol, tmp_path)
    replies = [chat[-1]["content"] for chat in row["messages"]]
    think_format = {"type": "format", "params": {"preferred_tags": ["think"]}}
    combined = CombinedReward(["accuracy_reward", think_format])
    expected = [a + b for a, b in zip(combined(replies, solution="5"),
                                      registry.create("reasoning_steps", weight=0.5)(replies),
                                      strict=True)]  # fmt: skip
    assert row["scores"] == pytest.approx(expected)
    assert row["ref_logprobs"] is None and row["distill_token_ids"] is None


def test_dedicated_server_multi_turn(smol: RunningServer, tmp_path: Path) -> None:
    (row,) = process("dedicated_server_env.py", smol, tmp_path)
    assert len(row["tokens"]) == 2
    for chat, masks in zip(row["messages"], row["masks"], strict=True):
        assert [m["role"] for m in chat] == ["user", "assistant", "user", "assistant"]
        assert masks[0] == -100 and any(m != -100 for m in masks)


def test_managed_path_with_tools_and_a_token_id_stop(smol: RunningServer, tmp_path: Path) -> None:
    (row,) = process("managed_tools_env.py", smol, tmp_path, "--openai.server_type=sglang")
    eos = 2  # SmolLM2's <|im_end|>
    for tokens, masks, logprobs, override, chat, score in zip(
        row["tokens"], row["masks"], row["inference_logprobs"], row["overrides"],
        row["messages"], row["scores"], strict=True,
    ):  # fmt: skip
        assert len(tokens) == len(masks) == len(logprobs)
        generated = [i for i, m in enumerate(masks) if m != -100]
        assert generated and generated[-1] == len(tokens) - 1
        assert all(masks[i] == tokens[i] and logprobs[i] <= 0 for i in generated)
        assert all(logprobs[i] == 1.0 for i in range(generated[0]))
        if override["finish_reason"] == "stop":  # stopped on the token id we passed
            assert tokens[-1] == eos
        _, _, error = parse_tool_call(chat[-1]["content"], [{"name": "get_weather"}])
        assert score == (0.0 if error else 1.0)


def test_teacher_distillation_fills_distill_arrays(smol: RunningServer, tmp_path: Path) -> None:
    (row,) = process(
        "teacher_distill_env.py", smol, tmp_path, f"--teacher.base_url={smol.url}/v1",
        f"--teacher.model_name={smol.name}", f"--teacher.tokenizer_name={smol.model_path}",
    )  # fmt: skip
    for tokens, ids, logprobs, inference, masks in zip(
        row["tokens"], row["distill_token_ids"], row["distill_logprobs"],
        row["inference_logprobs"], row["masks"], strict=True,
    ):  # fmt: skip
        assert len(ids) == len(logprobs) == len(tokens) and ids[0] == [] and logprobs[0] == []
        for position in range(1, len(tokens)):
            assert ids[position][0] == tokens[position] and 1 <= len(ids[position]) <= 4
            assert all(lp <= 0 and math.isfinite(lp) for lp in logprobs[position])
            if masks[position] != -100:  # the teacher is the student's own model here
                assert logprobs[position][0] == pytest.approx(inference[position], abs=2e-3)
