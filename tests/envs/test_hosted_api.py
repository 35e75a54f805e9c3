"""docs/hosted-api.md works as written: its `process` command, against a loopback
OpenAI-compatible server that returns no token ids and checks the bearer key, writes groups
re-tokenized from the replies' text; ``OPENAI_API_KEY`` is the key; no key is one line."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from envs_testlib import REPO_ROOT, child_env
from loopback_openai import loopback_openai

from atroposlib.envs.cli import parse_settings
from tests.fakes import uvicorn_on_loopback

DOC = REPO_ROOT / "docs" / "hosted-api.md"
HOSTED_URL = "https://api.openai.com/v1"
DOC_TOKENIZER = "HuggingFaceTB/SmolLM2-135M-Instruct"
KEY = "sk-loopback-test-key"


def documented_command() -> list[str]:
    """The doc's `process` command line, as argv (the script path made absolute)."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    [block] = [b for b in blocks if " process " in b]
    [line] = [ln for ln in block.replace("\\\n", " ").splitlines() if " process " in ln]
    argv = shlex.split(line)
    assert argv[0] == "python"
    return [sys.executable, str(REPO_ROOT / argv[1]), *argv[2:]]


def documented_figure(pattern: str) -> int:
    found = re.search(pattern, " ".join(DOC.read_text().split()))
    assert found is not None, pattern
    return int(found.group(1))


def swapped(argv: list[str], url: str, tokenizer: Path) -> list[str]:
    assert argv.count(HOSTED_URL) == 1 and argv.count(DOC_TOKENIZER) == 1
    return [url if a == HOSTED_URL else str(tokenizer) if a == DOC_TOKENIZER else a for a in argv]


def run(argv: list[str], cwd: Path, **environ: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in child_env(WANDB_MODE="disabled").items() if k != "OPENAI_API_KEY"}
    return subprocess.run(argv, cwd=cwd, env={**env, **environ}, capture_output=True,
                           text=True, timeout=300)  # fmt: skip


@pytest.fixture
def hosted() -> Iterator[tuple[str, Any]]:
    app = loopback_openai("gpt-4o-mini", key=KEY)
    with uvicorn_on_loopback(app) as url:
        yield f"{url}/v1", app


@pytest.mark.model
def test_the_documented_process_command(
    hosted: tuple[str, Any], test_model_path: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    url, app = hosted
    done = run(swapped(documented_command(), url, test_model_path), tmp_path, OPENAI_API_KEY=KEY)
    assert done.returncode == 0, done.stderr[-3000:]

    chats = [(auth, body) for path, auth, body in app.state.seen if path.endswith("/completions")]
    assert {auth for auth, _ in chats} == {f"Bearer {KEY}"}
    assert len(chats) == documented_figure(r"makes \*\*(\d+)\*\* requests")
    assert {body["n"] for _, body in chats} == {documented_figure(r"each for \*\*(\d+)\*\*")}
    assert {body["max_tokens"] for _, body in chats} == {documented_figure(r"most \*\*(\d+)\*\*")}
    assert not any(path == "/tokenize" for path, _, _ in app.state.seen)

    tokenizer = AutoTokenizer.from_pretrained(test_model_path)
    rows = [json.loads(line) for line in (tmp_path / "data/gsm8k-hosted.jsonl").open()]
    assert len(rows) == len(chats)
    for row in rows:
        assert len(row["tokens"]) == 8 and row.get("inference_logprobs") is None
        for i, (tokens, masks) in enumerate(zip(row["tokens"], row["masks"], strict=True)):
            reply = f"So the answer is \\boxed{{{i}}}."
            tail = [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
            assert tokens[-len(tail) :] == tail
            assert masks[-len(tail) :] == tail  # the reply is trained, token for token
    assert (tmp_path / "data/gsm8k-hosted.html").exists()


def test_no_key_for_a_hosted_api_is_one_line(tmp_path: Path) -> None:
    done = run(documented_command(), tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: no API key for the server at {HOSTED_URL}: export OPENAI_API_KEY=<your key> "
        "or pass --openai.api_key"
    ]


# ---- where the key comes from -------------------------------------------------------


def server_key(argv: list[str], environ: dict[str, str]) -> str | None:
    from environments.gsm8k.env import GSM8KEnv

    settings = parse_settings(GSM8KEnv, "process", argv, environ=environ)
    assert settings.openai is not None
    return settings.openai.api_key


@pytest.mark.parametrize(
    ("argv", "environ", "key"),
    [
        (["--openai.server_type", "openai"], {"OPENAI_API_KEY": "from-env"}, "from-env"),
        (["--openai.server_type", "openai", "--openai.api_key", "flag"],
         {"OPENAI_API_KEY": "from-env"}, "flag"),
        (["--openai.server_type", "openai"],
         {"OPENAI_API_KEY": "from-env", "ATROPOS_OPENAI__API_KEY": "ours"}, "ours"),
        ([], {"OPENAI_API_KEY": "from-env"}, ""),  # gsm8k's embedded server: not a hosted API
        (["--openai.server_type", "openai"], {}, ""),
    ],
)  # fmt: skip
def test_openai_api_key_is_the_key_when_none_is_given(
    argv: list[str], environ: dict[str, str], key: str
) -> None:
    assert server_key(argv, environ) == key
