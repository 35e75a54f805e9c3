"""Code envs and their sandbox: weak isolation refused in ``serve``, sandbox failures fail the
group (counted, never a score), code_game's determinism rule, ``atropos-sandbox-check``."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest
from envcat_testlib import (
    ENVIRONMENTS,
    REPO_ROOT,
    TokenFake,
    child_env,
    load_env_module,
    tokenizer_path,
)

from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.errors import ConfigError
from atroposlib.sandbox import IsolationReport, SandboxLimits, check_isolation, isolation
from atroposlib.sandbox import runner as sandbox_runner

code_eval = load_env_module("code_eval")
code_exec = load_env_module("code_execution")
code_game = load_env_module("code_game")
FENCE = "```python\n{}\n```"
WEAK = IsolationReport(isolation="audit_hook", mechanisms={}, limits={},
                       weaknesses=["no namespaces: test"])  # fmt: skip


def make_env(module: Any, cls_name: str, replies: Any, **config: Any) -> Any:
    env_cls = getattr(module, cls_name)
    settings = env_cls.env_config_cls(tokenizer_name=tokenizer_path(), **config)
    env = env_cls(settings, [APIServerConfig(model_name="x", base_url="http://127.0.0.1:9/v1")])
    env.server = TokenFake(replies, env.tokenizer)
    return env


def test_serving_refuses_weak_isolation_unless_allowed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(isolation, "isolation_report", lambda: WEAK)
    with pytest.raises(ConfigError, match=r"--env\.sandbox\.allow_weak_isolation"):
        check_isolation(SandboxLimits(), serving=True, env_name="code_eval")
    with caplog.at_level(logging.WARNING):
        check_isolation(SandboxLimits(allow_weak_isolation=True), serving=True, env_name="x")
        check_isolation(SandboxLimits(), serving=False, env_name="x")  # process / evaluate
    # logged at every start, the refused one included
    assert caplog.text.count("isolation is weak here: no namespaces: test") == 3


def test_serve_command_exits_with_the_reason_on_weak_isolation() -> None:
    env = {**child_env(), "ATROPOS_SANDBOX_ISOLATION": "audit_hook"}
    done = subprocess.run(
        [sys.executable, str(ENVIRONMENTS / "code_execution/env.py"), "serve",
         f"--env.tokenizer_name={tokenizer_path()}",
         "--env.rollout_server_url=http://127.0.0.1:9"],
        env=env, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert "weak isolation" in done.stderr and "--env.sandbox.allow_weak_isolation" in done.stderr


async def test_sandbox_failure_fails_the_group_and_is_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = make_env(code_exec, "CodeExecutionEnv", lambda messages, i: FENCE.format("print(1)"),
                   group_size=2)  # fmt: skip
    await env.setup()
    # the host's verdict taken first: a namespace probe run while the supervisor is missing
    # fails, and the worker's later sandbox tests would run on the fallback
    monkeypatch.setenv("ATROPOS_SANDBOX_ISOLATION", sandbox_runner.detect_isolation().value)
    missing = sandbox_runner._SUPERVISOR.with_name("missing.py")
    monkeypatch.setattr(sandbox_runner, "_SUPERVISOR", missing)
    assert await env.run_item({"prompt": "print one"}) == []
    metrics = env.perf.drain()
    assert metrics["perf/groups_rejected/sandbox_failure"] == 1.0
    assert metrics["perf/tasks_failed"] == 1.0


async def test_code_game_writer_with_nondeterministic_output_cannot_win() -> None:
    programs = ["print(6 * 7)", "print({'ab', 'cd', 'ef', 'gh', 'ij', 'kl'})",
                "print(hash('x'))", "import os\nprint(sorted(os.listdir('/proc')))"]  # fmt: skip

    def reply(messages: list[dict], index: int) -> str:
        if "Another player" in messages[-1]["content"]:
            return FENCE.format(programs[index])
        return "<answer>0</answer>"

    env = make_env(code_game, "CodeGameEnv", reply, group_size=4, predictor_samples=2)
    await env.setup()
    groups, _ = await env.collect_trajectories({"theme": "sets"})
    writer = groups[0]
    statuses = [e["sandbox_status"] for e in writer.extra]
    assert statuses == ["ok", "nondeterministic", "nondeterministic", "ok"]
    assert writer.scores[1:3] == [-1.0, -1.0]  # the penalty of a broken program
    assert writer.scores[0] == 1.0  # deterministic and nobody guessed it
    assert len(groups) == 3  # only the deterministic programs were shown to the predictor


def test_sandbox_check_reports_mechanisms_and_probes_hold() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.sandbox_check", "--json"],
        env=child_env(), capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["isolation"] == "namespaces" and report["weaknesses"] == []
    assert "unprivileged" in report["mechanisms"]["identity"]
    assert report["mechanisms"]["seccomp"].startswith("filter active")
    assert {probe["limit"] for probe in report["probes"]} >= {
        "processes", "memory, one process", "memory, all processes", "disk written",
        "cpu / wall time", "network", "host processes",
    }  # fmt: skip
    assert all(probe["held"] for probe in report["probes"]), report["probes"]
