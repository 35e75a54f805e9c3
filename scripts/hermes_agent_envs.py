"""Run hermes-agent's own RL environments (``terminal_test_env`` with the local terminal
backend, ``agentic_opd_env``) and its atroposlib-facing tests on this library, against our
embedded inference server, and say what came out.

    python scripts/hermes_agent_envs.py --hermes HERMES_CHECKOUT [--model MODEL_FOLDER] \\
        [--out results.json] [--work DIR]

HERMES_CHECKOUT is a snapshot of a hermes-agent repository that still has ``environments/``
(releases up to 0.13.0, or a fork keeping it); nothing of it is copied here. The server runs
the model (default: the offline test model) with ``--tool-call-parser hermes`` and a chat
template that renders ``tools`` (``tests/envs/hermes_style/hermes_tools.jinja``, also given to
the envs as their tokenizer's template), and ``--sample-log``, so each written sequence is
checked against what the engine sampled: a trained span must be ids the engine returned right
after exactly the ids before it (the managed path), never a re-tokenized placeholder.
The envs run with ``HOME`` and the working directory in a scratch folder (the local terminal
backend runs the model's commands there), wandb disabled, offline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "inference"))
from inference_helpers import SERVED_NAME, RunningServer, start_server, stop_server  # noqa: E402

from atroposlib.inference.sample_log import read_sample_log  # noqa: E402

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
]


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


def trained_spans(masks: list[int]) -> list[tuple[int, int]]:
    spans, start = [], None
    for index, mask in enumerate([*masks, -100]):
        if mask != -100 and start is None:
            start = index
        elif mask == -100 and start is not None:
            spans.append((start, index))
            start = None
    return spans


def check_rows(rows: list[dict[str, Any]], sampled: list[dict[str, Any]]) -> dict[str, Any]:
    """Per written sequence: are its trained spans outputs the engine sampled right there?"""
    served = {(tuple(s["prompt_ids"]), tuple(s["output_ids"])) for s in sampled}
    sequences = exact = spans_total = tool_calls = 0
    distill = []
    for row in rows:
        distill.append(row.get("distill_token_ids") is not None)
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
            "groups_with_distill_fields": sum(distill)}  # fmt: skip


def run_env(name: str, hermes: Path, server: RunningServer, tokenizer: Path, work: Path,
            log: Path) -> dict[str, Any]:  # fmt: skip
    script, extra = ENVS[name]
    folder = work / name
    (folder / "home").mkdir(parents=True, exist_ok=True)
    out = folder / "groups.jsonl"
    command = [sys.executable, str(hermes / script), "process",
               "--env.total_steps", "1", "--env.group_size", "2", "--env.max_agent_turns", "2",
               "--env.max_token_length", "1024", "--env.tokenizer_name", str(tokenizer),
               "--env.tool_call_parser", "hermes", "--env.use_wandb", "false",
               "--env.data_path_to_save_groups", str(out),
               "--openai.base_url", f"{server.url}/v1", "--openai.model_name", SERVED_NAME,
               "--openai.server_type", "embedded", "--openai.api_key", "x",
               "--openai.health_check", "false", *extra]  # fmt: skip
    before = len(read_sample_log(log)) if log.exists() else 0
    started = time.monotonic()
    done = subprocess.run(command, cwd=folder, env=child_env(hermes, folder / "home"),
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    (folder / "stderr.txt").write_text(done.stderr)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    sampled = read_sample_log(log)[before:] if log.exists() else []
    seconds = round(time.monotonic() - started)
    return {"env": name, "returncode": done.returncode, "seconds": seconds,
            "requests_sampled": len(sampled), **check_rows(rows, sampled),
            "stderr_tail": done.stderr[-600:] if done.returncode else ""}  # fmt: skip


def run_tests(hermes: Path, work: Path) -> dict[str, Any]:
    """hermes-agent's atroposlib-facing tests, from the snapshot, on this library."""
    report = work / "tests.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
               "--rootdir", str(hermes), *TESTS]  # fmt: skip
    done = subprocess.run(command, cwd=hermes, env=child_env(hermes, work / "home"),
                          capture_output=True, text=True, timeout=1800)  # fmt: skip
    report.write_text(json.dumps({"stdout": done.stdout[-20000:]}))
    summary = [line for line in done.stdout.splitlines() if " in " in line and "passed" in line]
    return {"files": TESTS, "returncode": done.returncode,
            "summary": summary[-1] if summary else done.stdout[-400:]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hermes", type=Path, required=True, help="hermes-agent checkout")
    parser.add_argument("--model", type=Path, help="model folder (default: the test model)")
    parser.add_argument("--work", type=Path, default=Path("hermes-agent-run"))
    parser.add_argument("--out", type=Path, default=Path("hermes-agent-results.json"))
    parser.add_argument("--commit", help="the snapshot's commit, when it is no git checkout")
    args = parser.parse_args(argv)
    if args.model is None:
        from atroposlib.utils.test_model import ensure_test_model

        args.model = Path(ensure_test_model())
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "sampled.jsonl"
    server = start_server(args.model, child_env(args.hermes, args.work), args.work / "server.log",
                          "--threads", "1", "--sample-log", str(log), "--tool-call-parser",
                          "hermes", "--chat-template", str(TEMPLATE))  # fmt: skip
    try:
        tokenizer = tokenizer_folder(args.model, args.work)
        envs = [run_env(name, args.hermes, server, tokenizer, args.work, log) for name in ENVS]
    finally:
        stop_server(server)
    commit = args.commit or snapshot_commit(args.hermes)
    results = {"date": datetime.date.today().isoformat(), "hermes_agent": str(args.hermes),
               "hermes_agent_commit": commit, "model": str(args.model), "envs": envs,
               "tests": run_tests(args.hermes, args.work)}  # fmt: skip
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    return 0 if all(e["returncode"] == 0 for e in envs) else 1


if __name__ == "__main__":
    sys.exit(main())
