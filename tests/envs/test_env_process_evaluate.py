"""``process`` (JSONL + HTML, no broker) and ``evaluate`` (metrics.json, samples, table)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from envs_testlib import Process, child_env, env_command


@pytest.mark.slow
def test_process_writes_jsonl_and_an_html_report(fake: Process, tmp_path: Path) -> None:
    out = tmp_path / "out" / "groups.jsonl"
    result = subprocess.run(
        env_command(
            "process",
            f"--openai.base_url={fake.url}/v1",
            "--env.total_steps=3",
            f"--env.data_path_to_save_groups={out}",
        ),
        env=child_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 3
    assert all(len(g["tokens"]) == 4 and sorted(g["scores"]) == [0, 0, 0, 1] for g in groups)
    page = out.with_suffix(".html").read_text()
    assert page.count('<details class="group"') == 3
    assert "The answer is 3" in page and "keydown" in page and "hsl(" in page
    assert "groups/s" in result.stderr and "mean score 0.250" in result.stderr


@pytest.mark.slow
def test_evaluate_writes_metrics_and_samples_and_prints_a_table(
    fake: Process, tmp_path: Path
) -> None:
    result = subprocess.run(
        env_command(
            "evaluate",
            f"--openai.base_url={fake.url}/v1",
            f"--env.data_dir_to_save_evals={tmp_path / 'evals'}",
        ),
        env=child_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    assert metrics["results"]["all"] == {"eval/accuracy": 0.0}
    assert "atropos|addition_eval|0" in metrics["results"]
    samples = (tmp_path / "evals" / "samples.jsonl").read_text().splitlines()
    assert json.loads(samples[0])["response"] == "The answer is 0"
    assert "eval/accuracy" in result.stdout and "0.0000" in result.stdout
