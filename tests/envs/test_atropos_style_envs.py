"""Atropos-style environment files (``tests/envs/atropos_style/``) run ``process`` against the
embedded inference server with the real small model: the reward registry, a dedicated
server, the managed-server path with tools and a token-id stop, teacher distillation, a group
whose messages are one flat conversation, and groups that form rarely or never."""

from __future__ import annotations

import json
import math
import re
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


def run_process(
    env_file: str, server: RunningServer, tmp: Path, *flags: str
) -> subprocess.CompletedProcess[str]:
    args = [
        sys.executable, str(ENVS / env_file), "process",
        f"--openai.base_url={server.url}/v1", f"--openai.model_name={server.name}",
        f"--env.tokenizer_name={server.model_path}", "--env.total_steps=1",
        f"--env.data_path_to_save_groups={tmp / 'groups.jsonl'}", *flags,
    ]  # fmt: skip
    return subprocess.run(args, cwd=tmp, env=child_env(), capture_output=True, text=True,
                          timeout=400)  # fmt: skip


def process(env_file: str, server: RunningServer, tmp: Path, *flags: str) -> list[dict[str, Any]]:
    done = run_process(env_file, server, tmp, *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (tmp / "groups.jsonl").read_text().splitlines()]


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


def test_one_flat_conversation_becomes_each_sequences_messages(
    smol: RunningServer, tmp_path: Path
) -> None:
    done = run_process("flat_messages_env.py", smol, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    prompt = [{"role": "system", "content": "Answer with one word."},
              {"role": "user", "content": "Name a colour."}]  # fmt: skip
    assert row["messages"] == [prompt, prompt] and len(row["tokens"]) == 2
    assert "'messages' is one conversation for the whole group" in done.stderr


def test_a_group_that_forms_on_the_40th_rollout_is_waited_for(
    smol: RunningServer, tmp_path: Path
) -> None:
    done = run_process("rare_group_env.py", smol, tmp_path, "--env.group_on_rollout=40")
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [json.loads(line) for line in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert row["scores"] == [0.0, 1.0]
    tried = int(re.findall(r"\((\d+) rollouts\)", done.stderr)[-1])
    assert 40 <= tried < 40 + 8  # 13 items given up on the way; 8 workers once groups fail


def test_a_group_that_never_forms_stops_at_the_budget_naming_its_flag(
    smol: RunningServer, tmp_path: Path
) -> None:
    done = run_process("rare_group_env.py", smol, tmp_path, "--env.group_on_rollout=-1",
                       "--env.process_max_attempts_without_group=8")  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "error: process wrote no group: 8 rollouts in a row wrote no group "
        "(--env.process_max_attempts_without_group 8; raise it to keep trying); 8 rollouts of 7 "
        "items; last failure: collect_trajectories gave no group"
    )
    assert not (tmp_path / "groups.jsonl").exists()
