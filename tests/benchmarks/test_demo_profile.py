"""benchmarks/demo_profile.py: which process is which, and how a step's time is split."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import demo_profile
from benchmarks.demo_profile import Trace, group_cost, phases, role_of, step_rows, summarize


def test_the_inference_health_url_comes_from_the_servers_port() -> None:
    argv = ["python", "-m", "atroposlib.inference", "--model", "m", "--port", "4321"]
    assert demo_profile.inference_health_url(argv) == "http://127.0.0.1:4321/health"
    assert demo_profile.inference_health_url(["python", "-m", "atroposlib.inference"]) is None


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["python", "-m", "example_trainer.train", "--config", "x"], "trainer"),
        (["python", "-m", "atroposlib.inference", "--model", "m"], "inference"),
        (["python", "-m", "vllm.entrypoints.openai.api_server"], "inference"),
        (["python", "-m", "atroposlib.api", "--port", "1"], "broker"),
        (["python", "environments/reasoning_gym/env.py", "serve"], "env"),
        (["python", "/abs/environments/reasoning_gym/env.py", "evaluate"], "eval"),
        (["python", "-m", "atroposlib.cli.local"], None),
    ],
)
def test_role_of(argv: list[str], role: str | None) -> None:
    assert role_of(argv) == role


def _group(prompt: int, replies: list[int], dropped: bool = False) -> dict:
    masks = [[-100] * prompt + [1] * n for n in replies]
    group = {"tokens": [[0] * len(m) for m in masks], "masks": masks}
    return {**group, "dropped": "all scores equal"} if dropped else group


def test_group_cost_counts_the_prompt_once() -> None:
    assert group_cost(_group(100, [5, 7, 3, 1])) == (116, 16)


def test_the_server_time_on_dropped_groups_charges_each_its_own_prompt_and_replies() -> None:
    examples = [7] * 90  # the worked examples every prompt begins with
    groups = [_group(0, [4, 4]), _group(0, [1, 1], dropped=True), _group(0, [2, 2])]
    for group, question in zip(groups, ([1, 2, 3, 4], [1, 2, 5, 6, 7, 8], [9, 9]), strict=True):
        group["tokens"] = [examples + question + [0] * (len(m)) for m in group["masks"]]
        group["masks"] = [[-100] * (90 + len(question)) + m for m in group["masks"]]
    assert demo_profile.prompt_of(groups[0]) == [*examples, 1, 2, 3, 4]
    assert demo_profile.shared_beginning(groups) == 90
    own = [(4, 8, False), (6, 2, True), (2, 4, False)]
    assert demo_profile.on_dropped(3.0, 7.0, own) == pytest.approx(3.0 * 6 / 12 + 7.0 * 2 / 14)
    assert demo_profile.shared_beginning([]) == 0
    assert demo_profile.on_dropped(1.0, 1.0, []) == 0.0


def _cpu(trainer: float, inference: float) -> dict[str, float]:
    return {"trainer": trainer, "inference": inference, "env": 0.0, "broker": 0.0, "eval": 0.0}


def test_each_step_gets_its_window_its_cpu_and_the_groups_finished_in_it() -> None:
    trace = Trace(started=100.0, ended=130.0)
    trace.lifetimes = {1: ["trainer", 105.0, 125.0], 2: ["eval", 101.0, 104.0]}
    trace.cpu = [(100.0, _cpu(0, 0)), (105.0, _cpu(0, 3)), (115.0, _cpu(8, 12)),
                 (125.0, _cpu(16, 15))]  # fmt: skip
    trace.groups = [
        (110.0, _group(100, [10, 10, 10, 10])),  # sent in step 1: costs 140
        (112.0, _group(100, [5, 5, 5, 5], dropped=True)),  # dropped in step 1: costs 120
        (120.0, _group(100, [10, 10, 10, 10])),
    ]
    trace.health = [
        (105.0, {"decode_steps": 10, "computed_rows": 50, "busy_seconds": 1.0,
                 "sequences_running": 8}),
        (110.0, {"decode_steps": 30, "computed_rows": 130, "busy_seconds": 4.0,
                 "sequences_running": 16}),
        (115.0, {"decode_steps": 50, "computed_rows": 210, "busy_seconds": 8.5,
                 "sequences_running": 12}),
    ]  # fmt: skip
    trace.metrics = [
        (115.0, {"step": 1, "train/data_wait_s": 2.0, "time/forward_backward_s": 6.0}),
        (115.5, {"step": 1, "sync/seconds": 1.0, "time/step_end_unix_s": 115.0}),
        (125.0, {"step": 2, "train/data_wait_s": 0.0, "time/forward_backward_s": 7.0}),
    ]
    first, second = step_rows(trace)
    assert first["wall_s"] == 10.0  # from the trainer's start to the step's end
    assert first["trainer_parts_s"] == {"wait": 2.0, "fwd+bwd": 6.0, "push": 1.0}
    assert first["cpu_s"]["trainer"] == 8.0 and first["cpu_s"]["inference"] == 9.0
    assert (first["groups_sent"], first["groups_dropped"]) == (1, 1)
    assert first["reply_tokens_dropped"] == 20
    assert first["inference_s_on_dropped"] == pytest.approx(9.0 * 120 / 260)
    # one prompt for all: no prefill of their own, the 7.5 server seconds split by replies
    assert first["server_s_on_dropped"] == pytest.approx(7.5 * 20 / 60)
    assert first["server"]["decode_steps"] == 40 and first["server"]["rows_per_decode"] == 4.0
    assert first["server"]["busy_seconds"] == 7.5 and first["server"]["rows_running"] == 14.0
    assert second["wall_s"] == 10.0 and second["cpu_s"]["inference"] == 3.0
    assert (second["groups_sent"], second["groups_dropped"]) == (1, 0)
    assert phases(trace) == {
        "whole_run": 30.0,
        "start_up": 1.0,
        "eval_before": 3.0,
        "training": 20.0,
        "eval_after": 0.0,
        "rest": 6.0,
    }
    means = summarize([first, second])
    assert means["wall_s_per_step"] == 10.0  # step 2 alone (step 1 waits for the first batch)
    assert means["trainer_fwd+bwd_s"] == 7.0 and means["inference_idle_s"] == 7.0


def test_a_whole_short_run_is_profiled(tmp_path: Path) -> None:
    """The watcher follows a real process tree: a stand-in for atropos-local starts a
    'trainer' that computes for a moment, appends a group to rollouts.jsonl and a metrics
    line once the trainer is done."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = (
        "import json, subprocess, sys, time, pathlib\n"
        f"run = pathlib.Path({str(run_dir)!r})\n"
        "code = 'import time; x = sum(range(3_000_000)); time.sleep(0.5)'\n"
        "child = subprocess.Popen([sys.executable, '-c', code, 'example_trainer.train'])\n"
        "time.sleep(0.2)\n"  # the env starts after the trainer
        "(run / 'rollouts.jsonl').write_text(json.dumps("
        "{'tokens': [[1, 2]], 'masks': [[-100, 2]]}) + '\\n')\n"
        "child.wait()\n"
        "(run / 'metrics.jsonl').write_text(json.dumps("
        "{'step': 1, 'train/data_wait_s': 0.1, 'time/step_end_unix_s': time.time()}) + '\\n')\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ))
    trace = demo_profile.watch(process, run_dir, poll_s=0.05)
    assert process.returncode == 0
    assert [role for role, _, _ in trace.lifetimes.values()] == ["trainer"]
    assert len(trace.groups) == 1
    (row,) = step_rows(trace)
    assert row["trainer_parts_s"] == {"wait": 0.1}
    assert row["groups_sent"] == 1
    assert trace.cpu[-1][1]["trainer"] > 0  # its CPU time was read before it exited
