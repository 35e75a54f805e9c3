"""atropos-local end to end, short: every part runs for real and nothing is left behind."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from atroposlib.cli.view_run import parse_settings as parse_view_run
from atroposlib.localrun import report
from atroposlib.localrun.components import RunLayout, free_port
from atroposlib.localrun.panel import LivePanel, PlainLines, RunStatus, StatusPoller, render
from tests.docs.doc_commands import REPO as REPO_ROOT
from tests.docs.doc_commands import doc_command


@pytest.mark.slow
def test_short_local_run_trains_syncs_weights_and_cleans_up(
    tmp_path: Path, test_model_path: Path, subprocess_env: dict[str, str]
) -> None:
    run_dir = tmp_path / "run"
    demo = doc_command("README.md", "scripts/demo")  # the README's first command, shorter
    result = subprocess.run(
        [str(REPO_ROOT / demo.argv[0]), "--run-dir", str(run_dir),
         "--model", str(test_model_path), "--steps", "2", "--batch-size", "8",
         "--group-size", "4", "--eval-size", "4", "--progress-interval-s", "5",
         "--behavior-logprobs", "inference",
         "--precision", "fp32",  # exact: bf16 (auto on CPUs with native bf16) differs ~1 %
         "--trainer-args", '["--loss.is-correction", "tis"]'],
        env=subprocess_env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["exit_code"] == 0
    assert summary["final_weight_version"] >= 2  # the trainer pushed weights after each step
    train_rows = [
        row
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if "train/loss" in (row := json.loads(line))
    ]
    assert [row["step"] for row in train_rows] == [1, 2]
    # the token path: the env sends the server's ids and logprobs; at step 1 the trainer's
    # weights are the sampling weights, so its importance ratio is 1
    groups = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    assert all(g["inference_logprobs"] and g["finish_reasons"] for g in groups)
    assert all(g["generation_params"]["temperature"] > 0 for g in groups)
    first = train_rows[0]
    if first["train/trained_tokens"] > 0:
        assert abs(first["train/is_weight"] - 1.0) <= 1e-4
    # the last checkpoint and the final weights, nothing older (checkpoints at steps 1 and 2);
    # best: links to the final weights when they beat the base model on the held-out problems
    best = summary["best_held_out"]
    kept = ["best"] if best["step"] > 0 else []
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        *kept,
        "step-2",
        "weights",
    ]
    assert [p.name for p in (run_dir / "checkpoints" / "weights").iterdir()] == ["step-2"]
    assert 0 < summary["disk_bytes"] <= report.disk_usage(run_dir) < 1.5e9
    # the README's next command opens this run in the viewer: it names the files just written
    view = doc_command("README.md", ".venv/bin/view-run").text.replace(
        "runs/local-<date>-<time>", str(run_dir)
    )
    assert parse_view_run(shlex.split(view)[1:]).input == [str(run_dir / "rollouts.jsonl")]
    held_out = summary["held_out_eval"]
    assert held_out["problems"] == 4
    assert held_out["overlap_with_training_pool"] == 0
    assert held_out["training_pool_problems"] > 1000
    assert held_out["overlap_with_trained_prompts"] == 0
    # stdout is not a terminal here: plain progress lines, every field in each
    lines = result.stdout.splitlines()
    assert any(line.startswith("held-out eval before training |") for line in lines)
    training = [line for line in lines if line.startswith("training |")]
    assert training and all(
        f" {field} " in line
        for line in training
        for field in ("step", "loss", "tokens/s", "queue (groups)", "weights")
    )
    assert "None" not in result.stdout
    assert "wrong->right" in result.stdout
    assert (run_dir / "eval_after" / "samples.jsonl").exists()
    assert report.rewards_by_step(run_dir / "rollouts.jsonl", 0.5)
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    alive = [pid for pid in summary["pids"].values() if psutil.pid_exists(pid)]
    alive = [pid for pid in alive if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    for name in ("broker", "inference", "trainer", "env-serve"):
        assert (run_dir / "logs" / f"{name}.log").exists()
    for name in ("trainer", "env-serve", "eval-before"):  # no line per HTTP request at INFO
        assert "HTTP Request:" not in (run_dir / "logs" / f"{name}.log").read_text()


def test_report_splits_format_from_correctness_and_counts_flips(tmp_path: Path) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    chat = [{"role": "user", "content": "1+1"}]
    groups = [
        {"policy_version": 0, "scores": [1.0, 0.0],
         "messages": [[*chat, {"role": "assistant", "content": "2"}],
                      [*chat, {"role": "assistant", "content": "3"}]]},
        {"policy_version": 1, "scores": [1.5, 0.5],
         "messages": [[*chat, {"role": "assistant", "content": "<answer>2</answer>"}],
                      [*chat, {"role": "assistant", "content": "<answer>3</answer>"}]]},
    ]  # fmt: skip
    rollouts.write_text("".join(json.dumps(g) + "\n" for g in groups))
    rows = report.rewards_by_step(rollouts, format_weight=0.5)
    assert [(r.step, r.reward, r.format_rate, r.correct) for r in rows] == [
        (0, 0.5, 0.0, 0.5),
        (1, 1.0, 1.0, 0.5),
    ]


def test_report_takes_partial_format_credit_out_of_correctness(tmp_path: Path) -> None:
    rollouts = tmp_path / "rollouts.jsonl"
    chat = [{"role": "user", "content": "1+1"}]
    replies = ["<answer>2</answer>", "Put it in <answer> tags: 2", "3"]  # credit 1, 0.25, 0
    messages = [[*chat, {"role": "assistant", "content": r}] for r in replies]
    group = {"policy_version": 0, "scores": [2.0, 1.25, 0.0], "messages": messages}
    rollouts.write_text(json.dumps(group) + "\n")
    (row,) = report.rewards_by_step(rollouts, format_weight=1.0, partial_format=True)
    assert row.format_rate == pytest.approx(1 / 3)  # exact shape only
    assert row.correct == pytest.approx(2 / 3)  # 2 of 3 right, partial credit taken out
    (exact_only,) = report.rewards_by_step(rollouts, format_weight=1.0)
    assert exact_only.correct == pytest.approx(2.25 / 3)  # the 0.25 counted as correctness


def write_eval(folder: Path, samples: list[dict], metrics: dict | None = None) -> None:
    folder.mkdir()
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    if metrics is not None:
        (folder / "metrics.json").write_text(json.dumps({"results": {"all": metrics}}))


def test_held_out_comparison_grades_strict_lenient_format_and_checks_overlap(
    tmp_path: Path,
) -> None:
    def sample(q: str, strict: bool, lenient: bool, formatted: bool) -> dict:
        return {"task": "t", "question": q, "problem": f"t:{q}", "response": "r",
                "strict": strict, "lenient": lenient, "formatted": formatted}  # fmt: skip

    check = {"eval/overlap_with_training_pool": 0.0, "eval/training_pool_problems": 900.0}
    write_eval(tmp_path / "before", [sample("a", False, True, False), sample("b", False, False,
               False), sample("c", False, False, False)], check)  # fmt: skip
    write_eval(tmp_path / "after", [sample("a", True, True, True), sample("b", False, True, False),
               sample("c", False, False, True)])  # fmt: skip
    rollouts = tmp_path / "rollouts.jsonl"
    prompts = ["c Give only the result.", "cc", "Calculate 1 + 1."]
    rollouts.write_text("".join(
        json.dumps({"scores": [0.0], "messages": [[{"role": "user", "content": p},
                                                   {"role": "assistant", "content": "x"}]]}) + "\n"
        for p in prompts))  # fmt: skip
    comparison = report.compare_evals(tmp_path / "before", tmp_path / "after", rollouts)
    assert comparison is not None and comparison.problems == 3
    assert (comparison.strict.before, comparison.strict.after) == (0.0, pytest.approx(1 / 3))
    assert (comparison.strict.right_to_wrong, comparison.strict.wrong_to_right) == (0, 1)
    assert comparison.lenient.before == pytest.approx(1 / 3)
    assert comparison.lenient.after == pytest.approx(2 / 3)
    assert (comparison.lenient.right_to_wrong, comparison.lenient.wrong_to_right) == (0, 1)
    assert (comparison.format_before, comparison.format_after) == (0.0, pytest.approx(2 / 3))
    assert comparison.overlap_with_training_pool == 0
    assert comparison.training_pool_problems == 900
    assert comparison.overlap_with_trained_prompts == 1  # "c" was trained on ("cc" is not "c")

    summary = report.write_summary(tmp_path / "summary.json", [], comparison, wall_s=60.0)
    written = json.loads((tmp_path / "summary.json").read_text())["held_out_eval"]
    assert written["problems"] == 3 and written["overlap_with_training_pool"] == 0
    assert "strict" in written["grading"]
    text = "\n".join(report.headline(summary))
    assert (
        "3 distinct problems (0 in the training pool of 900; 1 among the trained prompts)" in text
    )
    assert "right->wrong 0, wrong->right 1   gain +33.3 pts [+0.0, +100.0] (95 %)" in text


def test_envs_that_write_only_a_score_are_graded_by_it(tmp_path: Path) -> None:
    for label, scores in (("before", [1.0, 0.0, 0.0]), ("after", [0.0, 1.0, 1.0])):
        write_eval(tmp_path / label, [{"task": "t", "question": q, "response": "x", "score": s}
                                      for q, s in zip("abc", scores, strict=True)])  # fmt: skip
    comparison = report.compare_evals(tmp_path / "before", tmp_path / "after")
    assert comparison is not None and comparison.overlap_with_training_pool is None
    assert (comparison.lenient.right_to_wrong, comparison.lenient.wrong_to_right) == (1, 2)
    assert comparison.strict.before == pytest.approx(1 / 3)
    assert comparison.strict.after == pytest.approx(2 / 3)


def test_plain_lines_come_every_interval_and_at_each_phase_with_every_field() -> None:
    now, out = [0.0], []
    lines = PlainLines(out.append, 40, 30.0, clock=lambda: now[0])
    status = RunStatus(phase="training")
    lines.update(status)
    now[0] = 10.0
    lines.update(status)  # too soon: nothing
    status.train_row = {"step": 3, "train/loss": 0.25, "train/tokens_per_s": 180.0}
    status.rewards, status.queue_groups, status.weight_version = {"rg": 0.4}, 2, 3
    now[0] = 31.0
    lines.update(status)
    status.start_eval("held-out eval after training", Path("nowhere"))
    status.eval_progress = (5, 200)
    now[0] = 32.0
    lines.update(status)
    assert len(out) == 3
    assert out[0].startswith("training | elapsed ")
    assert "step 0 / 40 | reward - | loss - | tokens/s - | queue (groups) - | weights -" in out[0]
    assert out[1].endswith(
        "step 3 / 40 | reward (env rg) 0.400 | loss 0.2500 | tokens/s 180 | queue (groups) 2 | "
        "weights v3 | held-out eval - | held-out strict - | warning none"
    )
    assert out[2].startswith("held-out eval after training | ")
    assert out[2].endswith("held-out eval 5 / 200 answered | held-out strict - | warning none")


def test_the_panel_keeps_every_row_when_a_sync_row_comes_last(tmp_path: Path) -> None:
    from rich.console import Console

    layout = RunLayout(tmp_path, "model", free_port(), free_port())  # nothing listens there
    layout.metrics_file.write_text(
        json.dumps({"step": 1, "train/loss": 0.5, "train/tokens_per_s": 99.0,
                    "env/rg/reward_mean": 0.25}) + "\n"
        + json.dumps({"step": 1, "sync/seconds": 0.3, "sync/failed": 0}) + "\n"
    )  # fmt: skip
    with httpx.Client(timeout=0.5) as http:
        status = StatusPoller(layout, http).poll()
    console = Console(record=True, width=100)
    console.print(render(status, 40))
    text = console.export_text()
    for shown in ("step", "1 / 40", "reward (env rg)", "0.250", "0.5000", "99", "queue", "weights"):
        assert shown in text, text
    assert "None" not in text
    empty = Console(record=True, width=100)
    empty.print(render(RunStatus(), 40))
    first_frame = empty.export_text()
    assert "None" not in first_frame and "reward" in first_frame


def test_the_live_panel_redraws_in_a_terminal() -> None:
    import io

    from rich.console import Console

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    status = RunStatus(phase="held-out eval before training")
    with LivePanel(console, 40) as panel:
        panel.update(status)
        status.eval_progress = (57, 200)
        panel.update(status)
    drawn = screen.getvalue()
    assert "57 / 200 answered" in drawn and "held-out eval before training" in drawn
    assert "None" not in drawn


def test_the_inference_server_is_polled_every_few_seconds_not_every_frame(tmp_path: Path) -> None:
    asked: list[str] = []

    def serve(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/health":
            return httpx.Response(200, json={"weight_version": len(asked)})
        return httpx.Response(200, json={"current_step": 1, "queue_size": 2})

    now = [0.0]
    layout = RunLayout(tmp_path, "model", 1, 2)
    with httpx.Client(transport=httpx.MockTransport(serve)) as http:
        poller = StatusPoller(layout, http, health_interval_s=5.0, clock=lambda: now[0])
        for second in range(11):
            now[0] = float(second)
            status = poller.poll()
    assert asked.count("/status") == 11 and asked.count("/health") == 3  # at 0, 5 and 10 s
    assert status.queue_groups == 2 and status.weight_version is not None


def test_the_reward_curve_is_drawn_and_without_matplotlib_the_run_says_why_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [report.StepRewards(step, 8, 0.1 * step, 0.5, 0.2) for step in range(4)]
    drawn = tmp_path / "drawn.png"
    assert report.plot_rewards(rows, drawn) is None
    assert drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    missing = tmp_path / "missing.png"
    why = report.plot_rewards(rows, missing)
    assert why is not None and "matplotlib is not installed" in why
    assert not missing.exists()


@pytest.mark.parametrize(("served", "read"), [(3, 3), ("2", 2), ("default", None), (None, None)])
def test_the_weight_version_is_a_step_number_whichever_server_answers(
    tmp_path: Path, served: object, read: int | None
) -> None:
    """Our server answers an int, vLLM a label ("2" after two pushes): summary.json's
    final_weight_version is the same number either way."""

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"weight_version": served})
        return httpx.Response(200, json={"current_step": 1, "queue_size": 0})

    with httpx.Client(transport=httpx.MockTransport(serve)) as http:
        status = StatusPoller(RunLayout(tmp_path, "model", 1, 2), http).poll(fresh_weights=True)
    assert status.weight_version == read and type(status.weight_version) is type(read)
