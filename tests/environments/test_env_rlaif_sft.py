"""rlaif (pairs judged both ways, groups of two) and sft_loader (one-sequence SFT groups)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from envcat_testlib import load_env_module, process_groups, run_env

rlaif = load_env_module("rlaif")
sft = load_env_module("sft_loader")


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [("<verdict>A</verdict>", "A"), ("<verdict> B </verdict>", "B"), ("A is better", None),
     ("<verdict>C</verdict>", None), ("", None), ("<verdict>A</verdict><verdict>B</verdict>", "B")],
)  # fmt: skip
def test_parse_verdict_table(reply: str, verdict: str | None) -> None:
    assert rlaif.parse_verdict(reply) == verdict


@pytest.mark.slow
def test_rlaif_process_pairs_with_group_size_override(scripted, tmp_path: Path) -> None:
    server = scripted([
        {"when": "Response A:\nGood answer", "replies": ["<verdict>A</verdict>"]},
        {"when": "Response A:\nBad answer", "replies": ["<verdict>B</verdict>"]},
        {"when": "", "replies": ["Good answer", "Bad answer"]},
    ])  # fmt: skip
    groups = process_groups("rlaif", server, tmp_path, "--env.group_size=8")
    for group in groups:
        assert group["scores"] == [1.0, -1.0]
        assert group["group_overrides"] == {"group_size": 2}
        assert [m[-1]["content"] for m in group["messages"]] == ["Good answer", "Bad answer"]
    chats = [r["messages"][-1]["content"] for r in server.requests() if "messages" in r]
    judged = [content for content in chats if "Which response" in content]
    assert len(judged) == 2 * len(groups)  # both orders for each pair


@pytest.mark.parametrize(
    ("row", "roles"),
    [
        ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                       {"role": "assistant", "content": "a"}]}, ["system", "user", "assistant"]),
        ({"prompt": "p", "completion": "c"}, ["user", "assistant"]),
        ({"prefix": "p", "completion": "c", "score": 1.0}, ["user", "assistant"]),
        ({"instruction": "i", "output": "o"}, ["user", "assistant"]),
        ({"messages": [{"role": "user", "content": "no answer"}]}, None),
        ({"prompt": "p"}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_row_shapes(row: dict, roles: list[str] | None) -> None:
    messages = sft.row_to_messages(row)
    assert (None if messages is None else [m["role"] for m in messages]) == roles


@pytest.mark.slow
def test_sft_loader_streams_rows_as_sft_groups_and_stops(scripted, tmp_path: Path) -> None:
    turns = [("user", "Hi"), ("assistant", "Hello!"), ("user", "Bye"), ("assistant", "Ciao")]
    rows = [
        {"messages": [{"role": role, "content": text} for role, text in turns]},
        {"text": "not a chat"},
        {"prompt": "2+2?", "completion": "4"},
        {"instruction": "Say yes", "output": "yes"},
    ]  # fmt: skip
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    server = scripted([{"when": "", "replies": ["unused"]}])
    groups = process_groups("sft_loader", server, tmp_path, f"--env.data_path={data}", steps=10)
    assert len(groups) == 3  # the unusable row is skipped, then the stream ends
    for group in groups:
        assert group["group_overrides"] == {"sft": True, "group_size": 1}
        assert group["overrides"] == [{"sft": True}]
        assert group["scores"] == [1.0] and len(group["tokens"]) == 1
    assert [m["content"] for m in groups[0]["messages"][0]] == ["Hi", "Hello!", "Bye", "Ciao"]
    assert server.requests() == []  # loading SFT data never calls the inference server


@pytest.mark.slow
def test_sft_loader_without_data_fails_with_a_fix(scripted, tmp_path: Path) -> None:
    server = scripted([{"when": "", "replies": ["unused"]}])
    done = run_env("sft_loader", "process", server, tmp_path, "--env.total_steps=1")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error: no SFT data: set --env.data_path (JSONL) or --env.dataset_name"
    )
