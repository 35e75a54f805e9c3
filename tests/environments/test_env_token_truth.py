"""Truth checks: every shipped env trains on exactly what the embedded server sampled.

The real small model serves with ``--sample-log`` (every sampled sequence: prompt ids, output
ids, logprobs). Each env rolls out one item in process against it; then, per sequence:

- each trained span is an output the server sampled, right after that request's exact prompt
  ids, and the sequence is the last request's prompt + its output: nothing re-tokenized,
  nothing added after; masks cover exactly the sampled ids;
- ``inference_logprobs`` are the server's logprobs of those ids (1.0 elsewhere);
- the trainer's own logprobs at the same weights (its packed forward, CPU fp32) match them:
  the importance ratio of TIS / mask corrections is 1 at step 0.

The adapters (verifiers single-turn, multi-turn and tool envs written in the verifiers API,
the OpenEnv example server) get the same checks. The max |logprob delta| per env is printed
(``-s``) and written to ``$ATROPOS_TRUTH_REPORT``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from envcat_testlib import (
    ADAPTERS,
    child_env,
    roll_out,
    roll_out_adapter,
    trained_spans,
    trainer_deltas,
)

from atroposlib.inference.sample_log import read_sample_log

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "inference"))
from inference_helpers import SERVED_NAME, RunningServer, start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.model]

ENVS: dict[str, dict[str, Any]] = {
    "gsm8k": {"data_path": "fixture.jsonl"},
    "math": {"data_path": "fixture.jsonl"},
    "reasoning_gym": {},
    "letter_counting": {},
    "tool_calling": {},
    "openai_agent": {"max_turns": 3},
    "tictactoe": {},
    "blackjack": {},
    "code_execution": {},
    "code_eval": {},
    "code_game": {"predictor_samples": 2},
    "rlaif": {"judge_max_tokens": 8},
}
DELTAS: dict[str, float] = {}


@pytest.fixture(scope="module")
def smol(
    test_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningServer, Path]]:
    folder = tmp_path_factory.mktemp("truth")
    log = folder / "sampled.jsonl"
    server = start_server(
        test_model_path, child_env(), folder / "server.log", "--threads", "1", "--sample-log",
        str(log),
    )  # fmt: skip
    yield server, log
    stop_server(server)


@pytest.fixture(scope="module")
def trainer_model(test_model_path: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(test_model_path), dtype=torch.float32)
    return model.eval()


def assert_exactly_what_was_sampled(groups: list[dict[str, Any]], log: Path) -> int:
    """The checks of the module docstring; returns how many sampled spans were checked."""
    served = {
        (tuple(r["prompt_ids"]), tuple(r["output_ids"])): r["logprobs"]
        for r in read_sample_log(log)
    }
    checked = 0
    for group in groups:
        for i, (tokens, masks) in enumerate(zip(group["tokens"], group["masks"], strict=True)):
            logprobs = group["inference_logprobs"][i]
            spans = trained_spans(tokens, masks)
            for start, end in spans:
                key = (tuple(tokens[:start]), tuple(tokens[start:end]))
                assert key in served, f"sequence {i}: ids at {start}:{end} were not sampled there"
                assert logprobs[start:end] == served[key]
                checked += 1
            if spans:
                assert end == len(tokens), "nothing follows the last sampled reply"
            trained = {p for start, end in spans for p in range(start, end)}
            assert all(masks[p] == -100 and logprobs[p] == 1.0 for p in range(len(tokens))
                       if p not in trained)  # fmt: skip
    return checked


@pytest.mark.parametrize("name", [*ENVS, *ADAPTERS])
async def test_env_trains_exactly_what_the_server_sampled(
    name: str,
    smol: tuple[RunningServer, Path],
    trainer_model: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server, log = smol
    if name in ADAPTERS:
        monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
        groups = await roll_out_adapter(name, f"{server.url}/v1", SERVED_NAME, server.model_path,
                                        tmp_path)  # fmt: skip
    else:
        url = f"{server.url}/v1"
        groups = await roll_out(name, url, SERVED_NAME, server.model_path, ENVS[name])
    assert groups, f"{name} produced no group"
    spans = assert_exactly_what_was_sampled(groups, log)
    assert spans >= 1
    for group in groups:
        assert group["generation_params"]["temperature"] > 0
        assert len(group["finish_reasons"]) == len(group["tokens"])
        assert group["policy_versions"] == [0] * len(group["tokens"]) or name == "tictactoe"
    worst, metrics = trainer_deltas(groups, trainer_model)
    DELTAS[name] = worst
    is_weight = metrics["is_weight"] / metrics["rl_tokens"]
    sequences = sum(len(group["tokens"]) for group in groups)
    print(f"\n{name}: max |trainer - inference logprob| = {worst:.2e}, "
          f"mean IS ratio = {is_weight:.7f} over {int(metrics['rl_tokens'])} tokens "
          f"({spans} sampled replies in {sequences} sequences)")  # fmt: skip
    report = os.environ.get("ATROPOS_TRUTH_REPORT")
    if report:
        with open(report, "a") as handle:
            handle.write(json.dumps({"env": name, "max_abs_delta": worst, "is_ratio": is_weight,
                                     "tokens": metrics["rl_tokens"]}) + "\n")  # fmt: skip
    assert abs(is_weight - 1.0) <= 1e-4, "importance ratio at step 0 must be 1 +/- 1e-4"
    assert worst < 1e-4, "each token's ratio must be 1 +/- 1e-4 too"


async def test_sft_loader_trains_the_written_answer_and_samples_nothing(
    smol: tuple[RunningServer, Path], tmp_path: Path
) -> None:
    server, log = smol
    before = len(read_sample_log(log))
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"prompt": "2+2?", "completion": "4"}) + "\n")
    settings = {"data_path": str(data), "group_size": 1}
    [group] = await roll_out("sft_loader", f"{server.url}/v1", SERVED_NAME, server.model_path,
                             settings)  # fmt: skip
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(server.model_path))
    chat = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    whole = tokenizer.apply_chat_template(chat, tokenize=True)["input_ids"]
    assert group["tokens"] == [list(whole)]
    assert tokenizer.decode([t for t in group["masks"][0] if t != -100]).startswith("4")
    assert "inference_logprobs" not in group and group["group_overrides"]["sft"] is True
    assert len(read_sample_log(log)) == before
