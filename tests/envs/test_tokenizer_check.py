"""An env checks at start-up that its tokenizer gives the served model's ids (``POST
/tokenize``), against a real uvicorn on a loopback port: a match starts, a mismatch refuses
with one line (exit 1 through the CLI), hosted APIs and ``--env.check_tokenizer false`` skip."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from envs_testlib import child_env, env_command
from loopback_openai import loopback_openai

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import backend_for
from atroposlib.envs.tokenizer_check import PROBE_TEXT, check_tokenizer
from atroposlib.errors import ConfigError
from tests.fakes import uvicorn_on_loopback

SERVED = "smol-served"
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def smol_tokenizer(test_model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(test_model_path)


@pytest.fixture(scope="module")
def other_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer folder (a few words, a chat template): not SmolLM2's."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<|im_end|>", "What", "is", "user", "assistant", ":", "?", "+"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="[UNK]", eos_token="<|im_end|>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    folder = tmp_path_factory.mktemp("word-tokenizer")
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def vllm_like(smol_tokenizer: Any) -> Iterator[tuple[str, Any]]:
    """A server that tokenizes as SmolLM2 (what vLLM serving it answers): URL and app."""
    app = loopback_openai(SERVED, tokenizer=smol_tokenizer)
    with uvicorn_on_loopback(app) as url:
        yield url, app


def servers(url: str, server_type: str) -> list[Any]:
    config = APIServerConfig(model_name=SERVED, base_url=f"{url}/v1", server_type=server_type)
    return [backend_for(config)(config)]


def tokenize_calls(app: Any) -> int:
    return sum(path == "/tokenize" for path, _, _ in app.state.seen)


# ---- the check on its own --------------------------------------------------------------


@pytest.mark.model
@pytest.mark.parametrize("server_type", ["vllm", "sglang", "embedded"])
async def test_the_served_tokenizer_passes(
    vllm_like: tuple[str, Any], smol_tokenizer: Any, server_type: str
) -> None:
    url, app = vllm_like
    before = tokenize_calls(app)
    await check_tokenizer(servers(url, server_type), lambda: smol_tokenizer, "smol")
    assert tokenize_calls(app) == before + 1
    path, _, body = app.state.seen[-1]
    assert path == "/tokenize"
    assert body == {"model": SERVED, "prompt": PROBE_TEXT, "add_special_tokens": False}


@pytest.mark.model
async def test_another_tokenizer_is_refused_with_the_fix(
    vllm_like: tuple[str, Any], other_tokenizer: Path
) -> None:
    from transformers import AutoTokenizer

    other = AutoTokenizer.from_pretrained(other_tokenizer)
    with pytest.raises(ConfigError) as refused:
        await check_tokenizer(servers(vllm_like[0], "vllm"), lambda: other, "word-level")
    message = str(refused.value)
    assert "\n" not in message
    for named in ("'word-level'", repr(SERVED), vllm_like[0], "--env.tokenizer_name"):
        assert named in message


@pytest.mark.model
async def test_a_hosted_api_is_skipped_with_an_info_line(
    vllm_like: tuple[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    url, app = vllm_like
    before = tokenize_calls(app)

    with caplog.at_level(logging.INFO, logger="atroposlib.envs.tokenizer_check"):
        await check_tokenizer(servers(url, "openai"), never_loaded, "word-level")
    assert tokenize_calls(app) == before
    [line] = [r for r in caplog.records if r.name == "atroposlib.envs.tokenizer_check"]
    assert line.levelno == logging.INFO and "server_type openai" in line.getMessage()


async def test_an_older_server_without_tokenize_is_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logs = caplog.at_level(logging.WARNING, logger="atroposlib.envs.tokenizer_check")
    with uvicorn_on_loopback(loopback_openai(SERVED)) as url, logs:
        await check_tokenizer(servers(url, "vllm"), never_loaded, "not/on-this-machine")
    [warning] = [r for r in caplog.records if r.name == "atroposlib.envs.tokenizer_check"]
    assert warning.levelno == logging.WARNING and "404" in warning.getMessage()


@pytest.mark.model
async def test_the_embedded_server_behind_its_key(
    test_model_path: Path, smol_tokenizer: Any, other_tokenizer: Path
) -> None:
    """Our own server, keyed: the env's key reaches /tokenize, and the ids are compared."""
    from transformers import AutoTokenizer

    from atroposlib.inference import InferenceSettings, create_app

    app = create_app(InferenceSettings(model=str(test_model_path), api_key="k3y", threads=1))
    with uvicorn_on_loopback(app) as url:
        config = APIServerConfig(
            model_name="default", base_url=f"{url}/v1", server_type="embedded", api_key="k3y"
        )
        keyed = [backend_for(config)(config)]
        await check_tokenizer(keyed, lambda: smol_tokenizer, "smol")
        other = AutoTokenizer.from_pretrained(other_tokenizer)
        with pytest.raises(ConfigError, match="tokenizer mismatch"):
            await check_tokenizer(keyed, lambda: other, "word-level")


def never_loaded() -> Any:
    raise AssertionError("the tokenizer is loaded only when a server told its ids")


# ---- through the CLI: `process` against the loopback server --------------------------


def run_process(tmp_path: Path, url: str, tokenizer: Path | str, *extra: str) -> Any:
    flags = [
        "--env.total_steps", "1", "--env.use_wandb", "false",
        "--env.data_path_to_save_groups", str(tmp_path / "groups.jsonl"),
        "--env.tokenizer_name", str(tokenizer), "--openai.base_url", f"{url}/v1",
        "--openai.model_name", SERVED, "--openai.server_type", "vllm", *extra,
    ]  # fmt: skip
    return subprocess.run(env_command("process", *flags), cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.model
def test_process_starts_with_the_served_tokenizer(
    vllm_like: tuple[str, Any], test_model_path: Path, tmp_path: Path
) -> None:
    url, app = vllm_like
    before = tokenize_calls(app)
    done = run_process(tmp_path, url, test_model_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert tokenize_calls(app) == before + 1
    assert (tmp_path / "groups.jsonl").read_text().count("\n") == 1


@pytest.mark.model
def test_process_refuses_another_tokenizer_in_one_line(
    vllm_like: tuple[str, Any], other_tokenizer: Path, tmp_path: Path
) -> None:
    url, app = vllm_like
    chats = sum(path.endswith("/chat/completions") for path, _, _ in app.state.seen)
    done = run_process(tmp_path, url, other_tokenizer)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    for named in (str(other_tokenizer), SERVED, "--env.tokenizer_name"):
        assert named in errors[0]
    assert sum(path.endswith("/chat/completions") for path, _, _ in app.state.seen) == chats
    assert not (tmp_path / "groups.jsonl").exists()


@pytest.mark.model
def test_the_check_can_be_switched_off(
    vllm_like: tuple[str, Any], other_tokenizer: Path, tmp_path: Path
) -> None:
    url, app = vllm_like
    before = tokenize_calls(app)
    done = run_process(tmp_path, url, other_tokenizer, "--env.check_tokenizer", "false")
    assert done.returncode == 0, done.stderr[-3000:]
    assert tokenize_calls(app) == before
    assert (tmp_path / "groups.jsonl").exists()
