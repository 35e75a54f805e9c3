"""The trainer's metrics file: one flushed JSON line per step, readable while the run goes on."""

import json
from pathlib import Path

from example_trainer.config import load_config
from example_trainer.tracking import JsonlTracker, NullTracker, make_tracker


def test_jsonl_tracker_writes_one_line_per_step_and_flushes(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "metrics.jsonl"
    tracker = JsonlTracker(path)
    tracker.log({"train/loss": 0.5}, step=1)
    assert json.loads(path.read_text()) == {"step": 1, "train/loss": 0.5}  # flushed, not closed
    tracker.log({"train/loss": 0.25}, step=2)
    tracker.finish()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


def test_metrics_file_only_on_rank_zero(tmp_path: Path) -> None:
    cfg = load_config(["--metrics-file", str(tmp_path / "m.jsonl")])
    assert isinstance(make_tracker(cfg, rank=1), NullTracker)
    tracker = make_tracker(cfg, rank=0)
    tracker.log({"x": 1.0}, step=3)
    tracker.finish()
    assert json.loads((tmp_path / "m.jsonl").read_text())["x"] == 1.0
    assert isinstance(make_tracker(load_config([]), rank=0), NullTracker)


def test_a_misspelt_nested_option_is_refused_with_its_name() -> None:
    import pytest

    from atroposlib.errors import ConfigError

    with pytest.raises(ConfigError, match="clip_eps_hi"):
        load_config(["--loss.clip_eps_hi", "0.3"])
