"""atropos-local end to end, short: every part runs for real and nothing is left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from atroposlib.localrun import report


@pytest.mark.slow
def test_short_local_run_trains_syncs_weights_and_cleans_up(
    tmp_path: Path, test_model_path: Path, subprocess_env: dict[str, str]
) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.local", "--run-dir", str(run_dir),
         "--model", str(test_model_path), "--steps", "2", "--batch-size", "8",
         "--group-size", "4", "--eval-size", "4", "--no-panel",
         "--behavior-logprobs", "inference",
         "--trainer-args", '["--loss.is_correction", "tis"]'],
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
    assert all(g["generation_params"]["temperature"] == 0.7 for g in groups)
    first = train_rows[0]
    if first["train/trained_tokens"] > 0:
        assert abs(first["train/is_weight"] - 1.0) <= 1e-4
    assert any((run_dir / "checkpoints").iterdir())
    assert summary["held_out_eval"]["problems"] == 4
    assert (run_dir / "eval_after" / "samples.jsonl").exists()
    assert report.rewards_by_step(run_dir / "rollouts.jsonl", 0.5)
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    alive = [pid for pid in summary["pids"].values() if psutil.pid_exists(pid)]
    alive = [pid for pid in alive if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    for name in ("broker", "inference", "trainer", "env-serve"):
        assert (run_dir / "logs" / f"{name}.log").exists()


def test_bad_flag_is_one_line_and_exit_2(subprocess_env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.local", "--steps", "zero"],
        env=subprocess_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error:")
    assert len(result.stderr.strip().splitlines()) == 1


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
    for label, scores in (("before", [1.0, 0.0, 0.0]), ("after", [0.0, 1.0, 1.0])):
        folder = tmp_path / label
        folder.mkdir()
        lines = [
            json.dumps({"task": "t", "question": q, "response": "x", "score": s})
            for q, s in zip("abc", scores, strict=True)
        ]
        (folder / "samples.jsonl").write_text("\n".join(lines) + "\n")
    comparison = report.compare_evals(tmp_path / "before", tmp_path / "after")
    assert comparison is not None
    assert (comparison.right_to_wrong, comparison.wrong_to_right) == (1, 2)
    assert comparison.accuracy_before == pytest.approx(1 / 3)
    assert comparison.accuracy_after == pytest.approx(2 / 3)
