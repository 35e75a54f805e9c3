"""The sweep's settings and choice (benchmarks/learning_settings.py, learning_sweep.py) and how
the grid takes them (learning_vs_trl.py --settings-from)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.learning_settings import (
    DEFAULTS,
    OURS_KNOBS_FOR_TRL,
    Setting,
    chosen,
    first_stage,
    read_rows,
    row_for,
    second_stage,
    settings_for,
    sweep_grid,
)


def test_the_grid_sweeps_lr_temperature_and_trls_two_sets_of_knobs() -> None:
    grid = sweep_grid()
    ours = [s for s in grid if s.system == "ours"]
    trl = [s for s in grid if s.system == "trl"]
    assert (len(ours), len(trl), len({s.key for s in grid})) == (8, 16, 24)
    assert grid[0] == DEFAULTS["ours"] and grid[len(ours)] == DEFAULTS["trl"]
    assert {s.lr for s in trl} >= {1e-6} and {s.temperature for s in grid} == {0.7, 1.0}
    assert {s.knobs for s in trl} == {"defaults", "ours"}


def test_each_setting_becomes_its_systems_flags() -> None:
    ours = Setting("ours", 2e-5, 1.0)
    assert ours.ours_args() == ["--lr", "2e-05"] and ours.env_flags() == ["--env.temperature", "1"]
    at_ours_knobs = Setting("trl", 1e-5, 0.7, "ours").trl_overrides()
    assert at_ours_knobs == {"learning_rate": 1e-5, "temperature": 0.7, **OURS_KNOBS_FOR_TRL}
    assert DEFAULTS["trl"].trl_overrides() == {"learning_rate": 1e-6, "temperature": 1.0}
    with pytest.raises(ValueError, match="own knobs"):
        Setting("ours", 1e-5, 0.7, "defaults")


def rows(*figures: tuple[Setting, float]) -> list[dict]:
    lines = [row_for(s, "sums", 0, 10.0, validation={"strict": v}) for s, v in figures]
    return [json.loads(line) for line in lines]


def test_the_choice_is_the_best_validation_strict_and_ties_go_to_the_default() -> None:
    faster = Setting("ours", 2e-5, 0.7)
    tuned_trl = Setting("trl", 1e-5, 0.7, "ours")
    picks = chosen(rows((DEFAULTS["ours"], 0.50), (faster, 0.55), (DEFAULTS["trl"], 0.40),
                        (tuned_trl, 0.45)), "sums")  # fmt: skip
    assert picks == {"ours": faster, "trl": tuned_trl}
    tie = chosen(rows((faster, 0.5), (DEFAULTS["ours"], 0.5)), "sums")
    assert tie == {"ours": DEFAULTS["ours"]}
    assert chosen(rows((faster, 0.9)), "three_sums") == {}


def test_the_first_stage_sweeps_each_systems_rates_at_its_own_temperature() -> None:
    first = first_stage()
    ours = [s for s in first if s.system == "ours"]
    trl = [s for s in first if s.system == "trl"]
    assert (len(ours), len(trl)) == (4, 8) and first[0] == DEFAULTS["ours"]
    assert first[len(ours)] == DEFAULTS["trl"]
    assert {s.temperature for s in ours} == {0.7} and {s.temperature for s in trl} == {1.0}
    assert {(s.knobs, s.lr) for s in trl} == {(k, lr) for k in ("defaults", "ours")
                                              for lr in (1e-6, 3e-6, 1e-5, 2e-5)}  # fmt: skip


def test_the_second_stage_tries_the_other_temperature_at_each_best_rate() -> None:
    ours_fast, ours_slow = Setting("ours", 2e-5, 0.7), Setting("ours", 3e-6, 0.7)
    trl_fast = Setting("trl", 1e-5, 1.0, "defaults")
    trl_ours_knobs = [Setting("trl", lr, 1.0, "ours") for lr in (1e-6, 3e-6)]
    hot_but_off_stage = Setting("ours", 3e-6, 1.0)  # not at ours' own temperature: not ranked
    done = rows((DEFAULTS["ours"], 0.5), (ours_fast, 0.6), (ours_slow, 0.55),
                (hot_but_off_stage, 0.9), (DEFAULTS["trl"], 0.3), (trl_fast, 0.4),
                (trl_ours_knobs[0], 0.2), (trl_ours_knobs[1], 0.2))  # fmt: skip
    assert second_stage(done, "sums") == [
        Setting("ours", 2e-5, 1.0),
        Setting("trl", 1e-5, 0.7, "defaults"),
        Setting("trl", 1e-6, 0.7, "ours"),
    ]  # fmt: skip  (a tie: the first of them)
    tie = rows((ours_fast, 0.5), (DEFAULTS["ours"], 0.5))
    assert second_stage(tie, "sums") == [Setting("ours", 1e-5, 1.0)]  # ties: the default
    assert second_stage(done, "three_sums") == []


def test_the_sweep_runs_the_two_stages_unless_asked_for_the_whole_grid() -> None:
    from benchmarks.learning_sweep import parse_args, stage_settings

    args = parse_args([])
    done = rows((DEFAULTS["ours"], 0.5))
    assert stage_settings(args, "first", done, "sums") == first_stage()
    assert stage_settings(args, "second", done, "sums") == [Setting("ours", 1e-5, 1.0)]
    whole = parse_args(["--full-grid", "--ours-lrs", "1e-5", "--trl-lrs", "1e-6"])
    assert whole.full_grid and len(stage_settings(whole, "whole grid", done, "sums")) == 6


def test_the_grid_takes_the_sweeps_choice_and_trl_at_its_defaults_beside_it(
    tmp_path: Path,
) -> None:
    from benchmarks.learning_vs_trl import cell_systems, parse_args

    path = tmp_path / "sweep.jsonl"
    tuned_trl = Setting("trl", 1e-5, 0.7, "ours")
    path.write_text("".join(row_for(s, "sums", 0, 10.0, validation={"strict": v})
                            for s, v in ((DEFAULTS["ours"], 0.5), (tuned_trl, 0.4),
                                         (DEFAULTS["trl"], 0.3))) + '{"cut off')  # fmt: skip
    assert len(read_rows(path)) == 3  # a line cut off by an interruption is skipped
    assert settings_for(path, "sums") == {"ours": DEFAULTS["ours"], "trl": tuned_trl}
    args = parse_args(["--settings-from", str(path)])
    assert cell_systems(args, "sums") == {"ours": DEFAULTS["ours"], "trl": tuned_trl,
                                          "trl_defaults": DEFAULTS["trl"]}  # fmt: skip
    assert cell_systems(parse_args([]), "sums") == DEFAULTS  # no sweep: both at defaults
    with pytest.raises(SystemExit, match="no finished sweep run of ours, trl on family"):
        settings_for(path, "family")


def test_the_grid_defaults_to_20_minutes_snapshots_every_5_and_the_drop_warning_on() -> None:
    from benchmarks.learning_vs_trl import parse_args

    args = parse_args([])
    assert (args.minutes, args.points, args.drop_check_every_steps) == (20.0, 4, 15)
    assert args.seed == 1


def test_the_sweep_table_names_each_systems_choice(tmp_path: Path) -> None:
    from benchmarks.learning_sweep import main, sweep_table

    figures = {"steps": 30, "validation": {"strict": 0.5, "lenient": 0.5, "formatted": 1.0}}
    lines = [row_for(DEFAULTS["ours"], "sums", 0, 10.0, **figures),
             row_for(DEFAULTS["trl"], "sums", 0, 10.0, **figures)]  # fmt: skip
    table = sweep_table([json.loads(line) for line in lines])
    assert "| sums | ours | ours | 1e-05 | 0.7 | 30 | 50.0 % | 50.0 % | 100.0 % |" in table
    assert ("sums: chosen ours lr=1e-05 T=0.7 (its default); "
            "trl at its default knobs lr=1e-06 T=1 (its default)") in table  # fmt: skip
    (tmp_path / "sweep.jsonl").write_text("".join(lines))
    assert main(["--table-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "sweep.txt").read_text() == table + "\n"
    assert main(["--table-only", "--out", str(tmp_path / "none")]) == 1
