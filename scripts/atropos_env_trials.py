"""Run every Atropos environment file in ``process`` mode, as a new user would, with a given
Python (a venv with atroposlib 0.4.0 as the control, or ours) against one OpenAI-compatible
server, and record what happened.

    python scripts/atropos_env_trials.py --atropos ATROPOS_ENVS --python VENV/bin/python \\
        --base-url http://127.0.0.1:9001/v1 --model MODEL_FOLDER --out results.json

ATROPOS_ENVS holds Atropos's ``environments/`` only: its ``atroposlib/`` folder would shadow the
library under test (``git archive HEAD environments`` of the repository gives that). Each file
with a ``__main__`` block runs from there (on ``PYTHONPATH``) with
``--env.total_steps 1 --env.group_size 2``, the model folder as tokenizer and served model,
``server_type sglang`` (token ids for managed-server envs), offline (HF_HUB_OFFLINE=1) and
wandb disabled, ``OPENAI_API_KEY`` set to a placeholder when unset (some files refuse to start
without one), an inherited ``PYTHONPATH`` kept after the checkout (to test a work tree). A run
counts as written when it exits 0 and its JSONL holds a row; ``rollouts`` is what our
``process`` reports having tried.
``--compare a.json b.json`` prints the files written on ``a`` but not on ``b``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any


def runnable(checkout: Path) -> list[Path]:
    files = []
    for path in sorted((checkout / "environments").rglob("*.py")):
        text = path.read_text(errors="replace")
        if "atroposlib" in text and "__main__" in text and ".cli()" in text:
            files.append(path)
    return files


def run_one(path: Path, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    rel = str(path.relative_to(args.atropos))
    out = scratch / (rel.replace("/", "__") + ".jsonl")
    command = [
        args.python, str(path), "process",
        "--env.total_steps", "1", "--env.group_size", "2", "--env.max_token_length", "256",
        "--env.tokenizer_name", args.model, "--env.data_path_to_save_groups", str(out),
        "--openai.base_url", args.base_url, "--openai.model_name", args.model,
        "--openai.api_key", "x", "--openai.server_type", "sglang",
    ]  # fmt: skip
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(args.atropos), *inherited]),
           "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "x"),
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=args.atropos, env=env, capture_output=True,
                              text=True, timeout=args.timeout)  # fmt: skip
        code, stderr = done.returncode, done.stderr
    except subprocess.TimeoutExpired as exc:
        code = "timeout"
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
    rows = 0
    for candidate in scratch.glob(out.stem + "*.jsonl"):
        rows += sum(1 for line in candidate.read_text(errors="replace").splitlines() if line)
    ours = re.findall(r"\((\d+) rollouts\)", stderr or "")  # our process's last log line
    rollouts = int(ours[-1]) if ours else None
    lines = [line for line in (stderr or "").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return {"file": rel, "exit": code, "rows": rows, "rollouts": rollouts,
            "seconds": round(time.monotonic() - started),
            "written": code == 0 and rows > 0,
            "last": (errors or lines or [""])[-1][-300:]}  # fmt: skip


def compare(a: Path, b: Path) -> int:
    first = {r["file"]: r for r in json.loads(a.read_text())}
    second = {r["file"]: r for r in json.loads(b.read_text())}
    lost = sorted(f for f, r in first.items() if r["written"] and not second[f]["written"])
    print(
        f"{a.name}: {sum(r['written'] for r in first.values())} of {len(first)} written; "
        f"{b.name}: {sum(r['written'] for r in second.values())} of {len(second)} written"
    )
    for name in lost:
        print(f"  written on {a.name}, not on {b.name}: {name}: {second[name]['last']}")
    return 1 if lost else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atropos", type=Path)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--base-url")
    parser.add_argument("--model")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--timeout", type=float, default=150.0)
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--only", nargs="*", help="run only these files (relative paths)")
    parser.add_argument("--compare", nargs=2, type=Path)
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    args.atropos, args.out = args.atropos.resolve(), args.out.resolve()  # the runs' cwd differs
    if (args.atropos / "atroposlib").exists():
        parser.error(f"{args.atropos}/atroposlib would shadow the library under test; give a "
                     "folder with Atropos's environments/ only")  # fmt: skip
    scratch = args.out.with_suffix(".d")
    scratch.mkdir(parents=True, exist_ok=True)
    files = runnable(args.atropos)
    if args.only:
        files = [f for f in files if str(f.relative_to(args.atropos)) in set(args.only)]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda p: run_one(p, args, scratch), files))
    args.out.write_text(json.dumps(results, indent=1))
    written = [r for r in results if r["written"]]
    print(f"{len(written)} of {len(results)} env files wrote JSONL")
    for r in results:
        tries = f" rollouts={r['rollouts']}" if r.get("rollouts") is not None else ""
        print(f"{'OK ' if r['written'] else 'no '} {r['file']}  exit={r['exit']} rows={r['rows']}"
              f"{tries} {r['seconds']}s  {'' if r['written'] else r['last'][:150]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
