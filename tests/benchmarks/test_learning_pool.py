"""benchmarks/learning_pool.py: the per-seed and pooled tables of learning_vs_trl.py runs,
from run folders laid out as the benchmark writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atroposlib.localrun.bootstrap import bootstrap_mean
from benchmarks.learning_pool import (
    hierarchical_bootstrap,
    issue35_target_lines,
    load_summaries,
    main,
    minutes_to_reach,
    missing_cells,
    pooled_table,
    seed_row,
    stratified_bootstrap,
    t_interval,
    target_lines,
    task_difference,
)

PROBLEMS = 20


def write_run(
    root: Path, task: str, seed: int, ours_right: int, trl_right: int, defaults_right: int = -1
) -> dict:
    """A task folder: the base model right on 2 problems; ours right on the first
    ``ours_right`` after training, TRL on the first ``trl_right`` (and TRL at its defaults, a
    third system, on the first ``defaults_right`` when that is not -1)."""
    folder = root / task
    (folder / "eval").mkdir(parents=True)

    def graded(label: str, right: int) -> None:
        rows = [{"problem": str(i), "strict": i < right} for i in range(PROBLEMS)]
        (folder / "eval" / f"{label}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    graded("base", 2)
    curves = {}
    systems = [("ours", ours_right), ("trl", trl_right)]
    if defaults_right >= 0:
        systems.append(("trl_defaults", defaults_right))
    for system, right in systems:
        halfway = f"{system}-step-5"
        final = f"{system}-step-10"
        graded(halfway, (2 + right) // 2)
        graded(final, right)
        curves[system] = {
            "training": {"steps": 10},
            "curve": [
                {"minutes": 5.0, "label": halfway, "strict": (2 + right) // 2 / PROBLEMS},
                {"minutes": 10.0, "label": final, "strict": right / PROBLEMS},
            ],
        }
    summary = {"task": task, "seed": seed, "run_dir": str(folder), "minutes": 10.0,
               "base": {"strict": 2 / PROBLEMS}, "systems": curves}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    return summary


def test_minutes_to_reach_is_the_first_snapshot_at_or_above_the_target() -> None:
    curve = [{"minutes": 5.0, "strict": 0.3}, {"minutes": 10.0, "strict": 0.6}]
    assert minutes_to_reach(curve, 0.3) == 5.0
    assert minutes_to_reach(curve, 0.5) == 10.0
    assert minutes_to_reach(curve, 0.7) is None


def test_a_seed_row_reads_each_systems_final_grades(tmp_path: Path) -> None:
    row = seed_row(write_run(tmp_path, "sums", 0, ours_right=12, trl_right=6))
    assert row["before"] == pytest.approx(0.1)
    assert row["after"] == {"ours": pytest.approx(0.6), "trl": pytest.approx(0.3)}
    assert row["gain"]["ours"].estimate == pytest.approx(0.5)
    assert sum(row["difference"]) / PROBLEMS == pytest.approx(0.3)
    assert row["minutes_to_trl"] == 5.0  # ours' halfway (7 of 20) is above TRL's final (6)


def test_the_pooled_interval_resamples_within_each_seed() -> None:
    same = stratified_bootstrap([[1.0] * 5, [1.0] * 50])
    assert (same.estimate, same.low, same.high) == (1.0, 1.0, 1.0)
    mixed = stratified_bootstrap([[0.0, 1.0] * 100, [1.0] * 200])
    assert mixed.estimate == pytest.approx(0.75)
    assert 0.7 < mixed.low < 0.75 < mixed.high < 0.8
    # the all-ones seed never resamples to anything else: narrower than an interval over the
    # 400 values taken together (about 0.069 against 0.085 wide)
    together = bootstrap_mean([0.0, 1.0] * 100 + [1.0] * 200)
    assert mixed.high - mixed.low < 0.9 * (together.high - together.low)


def test_the_table_has_every_seed_and_a_pooled_line_per_task(tmp_path: Path) -> None:
    summaries = [
        write_run(tmp_path / "a", "sums", 0, ours_right=12, trl_right=6),
        write_run(tmp_path / "b", "sums", 1, ours_right=10, trl_right=10),
        write_run(tmp_path / "a", "three_sums", 0, ours_right=4, trl_right=8),
    ]
    table = pooled_table(summaries, "test")
    assert "| sums | 0 | 10 / 10 | 10.0 % | 60.0 % (+50.0" in table
    assert "| three_sums | 0 |" in table and "| not |" in table  # ours never reached TRL's 40 %
    assert "sums, pooled over seeds [0, 1]: ours - TRL strict gain +15.0" in table
    assert "(seeds, then problems resampled); t over seeds [" in table
    assert "lowest seed +0.0" in table
    assert "three_sums, pooled" not in table  # one seed: nothing to pool
    assert "three_sums, seed 0 only: nothing to pool yet" in table


def test_the_command_writes_the_table_and_the_plot(tmp_path: Path) -> None:
    write_run(tmp_path / "run0", "sums", 0, ours_right=12, trl_right=6)
    write_run(tmp_path / "run1", "sums", 1, ours_right=14, trl_right=8)
    out = tmp_path / "docs" / "pooled"
    assert main([str(tmp_path / "run0"), str(tmp_path / "run1"), "--out", str(out)]) == 0
    assert "pooled over seeds [0, 1]" in out.with_suffix(".txt").read_text()
    assert out.with_suffix(".png").stat().st_size > 1000
    assert (
        "missing from the grid: sums-seed2, three_sums-seed0" in out.with_suffix(".txt").read_text()
    )
    assert main([str(tmp_path / "empty")]) == 1
    # no page of the repository has a grid table of this folder: a one-line reason, no write
    with pytest.raises(SystemExit, match=r"no page has a grid table of .*run0: add"):
        main([str(tmp_path / "run0"), "--docs"])
    with pytest.raises(SystemExit):  # which folder's table would it fill?
        main([str(tmp_path / "run0"), str(tmp_path / "run1"), "--docs"])


def test_issue_35s_targets_are_judged_per_task_with_their_figures(tmp_path: Path) -> None:
    rows = [
        seed_row(write_run(tmp_path / "a", "sums", 0, ours_right=12, trl_right=6)),
        seed_row(write_run(tmp_path / "b", "sums", 1, ours_right=10, trl_right=10)),
    ]
    lines = issue35_target_lines(rows)
    assert lines[0].startswith("ours ends within 5 points of its best snapshot: met")
    # two seeds that disagree (+30, +0): resampling seeds, the interval reaches 0
    assert lines[1] == "pooled ours - TRL >= +10, interval above 0: MISSED (+15.0 [+0.0, +40.0])"
    assert (
        lines[2].startswith("ours - TRL >= +5 on every seed: MISSED") and "seed 1 +0.0" in lines[2]
    )
    # seed 0: ours' halfway (7 right) is at TRL's final (6) at 5.0 min, TRL's half is 5.0
    assert "seed 0 5.0 min (half: 5.0)" in lines[3] and "seed 1 10.0 min" in lines[3]
    assert "MISSED" in lines[3]
    falling = write_run(tmp_path / "c", "sums", 2, ours_right=10, trl_right=4)
    falling["systems"]["ours"]["curve"][0]["strict"] = 0.9  # best 90 %, ends at 50 %
    assert "MISSED (falls seed 2 40.0)" in issue35_target_lines([seed_row(falling)])[0]


def test_issue_46s_targets_are_judged_per_task_and_over_the_grid(tmp_path: Path) -> None:
    def independent(folder: str, task: str, seed: int, ours: int, trl: int) -> dict:
        summary = write_run(tmp_path / folder, task, seed, ours_right=ours, trl_right=trl)
        return {**summary, "seeds": {"train": seed, "test": 1000 + seed}}

    summaries = [
        independent("a", "sums", 0, 12, 6),  # +30
        independent("b", "sums", 1, 14, 8),  # +30
        independent("a", "three_sums", 0, 10, 10),  # +0
        independent("a", "family", 0, 9, 6),  # +15 on one seed
    ]
    rows = [seed_row(s) for s in summaries]
    sums = target_lines(rows[:2], task_difference(rows[:2]))
    assert sums[0].startswith("ours ahead, interval above 0: met (+30.0 [+")
    assert sums[0].endswith("], resampling seeds, then problems)")
    assert sums[1].startswith("ours - TRL >= +5: met (+30.0 [+")
    assert sums[2].startswith("ours ends within 5 points of its best snapshot: met")
    level = target_lines(rows[2:3], task_difference(rows[2:3]))
    assert level[0].startswith("ours ahead, interval above 0: MISSED (+0.0 [+0.0, +0.0]")
    assert "seed 0's problems only" in level[0]
    assert level[1].startswith("ours - TRL >= +5: MISSED")
    table = pooled_table(summaries, "test")
    assert "  ours - TRL >= +5 on every seed" not in table  # issue 35's targets are not judged
    ahead = "grid: ours ahead with the interval above 0 on every task: MISSED"
    assert f"{ahead} (not on three_sums, family)" in table
    assert "grid: ours - TRL >= +5 on at least two tasks: met (sums, family)" in table
    assert "grid: no run of ours ends more than 5 points below its best snapshot: met" in table
    assert "(largest fall 0.0 of 4 runs)" in table


def test_a_published_folder_pools_wherever_it_lies_and_the_gaps_are_named(tmp_path: Path) -> None:
    write_run(tmp_path / "run", "sums", 0, ours_right=12, trl_right=6)
    moved = tmp_path / "docs" / "grid"
    moved.mkdir(parents=True)
    (tmp_path / "run" / "sums").rename(moved / "sums-seed0")
    summaries = load_summaries([moved])
    assert summaries[0]["run_dir"] == str(moved / "sums-seed0")
    assert seed_row(summaries[0])["after"]["ours"] == pytest.approx(0.6)
    missing = missing_cells(summaries, ["sums", "three_sums"], (0, 1, 2))
    assert missing == ["sums-seed1", "sums-seed2", "three_sums-seed0", "three_sums-seed1",
                       "three_sums-seed2"]  # fmt: skip


def test_docs_get_the_grid_table_between_their_markers_and_nothing_else(tmp_path: Path) -> None:
    from benchmarks.learning_pool import fill_block, readme_block, results_block

    table = pooled_table(
        [
            write_run(tmp_path / "a", "sums", 0, ours_right=12, trl_right=6),
            write_run(tmp_path / "b", "sums", 1, ours_right=10, trl_right=10),
        ],
        "test",
    )
    page = tmp_path / "README.md"
    page.write_text("intro\n<!-- grid table: benchmarks/learning_pool.py -->\nold\n"
                    "<!-- end of grid table -->\noutro\n")  # fmt: skip
    fill_block(page, readme_block(table))
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("<!-- end of grid table -->\noutro\n")
    assert "old" not in text
    assert "| sums | 0 | 10.0 % | 60.0 % | 30.0 % | +30.0 [" in text
    assert "- sums, pooled over seeds [0, 1]: ours - TRL strict gain +15.0" in text
    listed = results_block(table)
    assert "\n- sums, pooled over seeds [0, 1]" in listed
    assert "\n  - ours - TRL >= +5 on every seed: MISSED" in listed
    bare = tmp_path / "other.md"
    bare.write_text("no markers\n")
    with pytest.raises(SystemExit, match="no grid-table markers"):
        fill_block(bare, "x")


def test_each_grid_table_is_filled_only_from_the_run_folder_its_marker_names(
    tmp_path: Path,
) -> None:
    from benchmarks.learning_pool import fill_block

    page = tmp_path / "results.md"
    page.write_text(
        "<!-- grid table: benchmarks/learning_pool.py -->\nold grid\n<!-- end of grid table -->\n"
        "between\n"
        "<!-- grid table: benchmarks/learning_pool.py docs/tuned -->\n"
        "<!-- end of grid table -->\n"  # a new table: nothing between its markers yet
    )
    assert fill_block(page, "new tuned", "docs/tuned")
    assert "py docs/tuned -->\nnew tuned\n<!-- end" in page.read_text()
    assert page.read_text().count("new tuned") == 1 and "old grid" in page.read_text()
    assert fill_block(page, "new grid")  # a marker naming no folder is issue 35's grid
    assert "old grid" not in page.read_text() and "new tuned" in page.read_text()
    assert not fill_block(page, "x", "docs/elsewhere")
    assert "x\n" not in page.read_text()


def test_trl_at_its_defaults_gets_its_own_columns_and_pooled_line_where_cells_ran_it(
    tmp_path: Path,
) -> None:
    from benchmarks.learning_pool import readme_block

    summaries = [
        write_run(tmp_path / "a", "sums", 1, ours_right=12, trl_right=6, defaults_right=4),
        write_run(tmp_path / "b", "sums", 2, ours_right=10, trl_right=10, defaults_right=2),
    ]
    table = pooled_table(summaries, "test")
    assert "| steps ours / TRL / TRL at defaults |" in table
    # before 10 %; ours 60 % (+50), TRL 30 % (+20), TRL at defaults 20 % (+10)
    assert "| sums | 1 | 10 / 10 / 10 | 10.0 % | 60.0 % (+50.0 [" in table
    assert "| 20.0 % (+10.0 [" in table and "| +30.0 [" in table and "| +40.0 [" in table
    assert "sums, pooled over seeds [1, 2]: ours - TRL strict gain +15.0" in table
    assert "sums, pooled over seeds [1, 2]: ours - TRL at its defaults strict gain +40.0" in table
    readme = readme_block(table)
    assert readme.splitlines()[0] == (
        "| task | seed | before | ours after | TRL after | TRL at defaults after "
        "| ours - TRL, strict points | ours - TRL at defaults |"
    )
    assert "| sums | 2 | 10.0 % | 50.0 % | 50.0 % | 10.0 % | +0.0 [+0.0, +0.0] | +40.0 [" in readme
    # issue 35's cells ran TRL at its defaults as TRL itself: no second line repeats the first
    alone = pooled_table([write_run(tmp_path / "c", "sums", 0, 12, 6),
                          write_run(tmp_path / "d", "sums", 1, 10, 10)], "test")  # fmt: skip
    assert "at its defaults" not in alone and "| steps ours / TRL |" in alone


def test_the_hierarchical_interval_holds_the_spread_between_seeds() -> None:
    # three seeds with very different gains: +40, +0 and +20 points on 200 problems each
    seeds = [[1.0] * 80 + [0.0] * 120, [1.0] * 20 + [0.0] * 20 + [-1.0] * 20 + [0.0] * 140,
             [1.0] * 40 + [0.0] * 160]  # fmt: skip
    hierarchical = hierarchical_bootstrap(seeds)
    within = stratified_bootstrap(seeds)
    assert hierarchical.estimate == pytest.approx(within.estimate) == pytest.approx(0.2)
    assert hierarchical.high - hierarchical.low > 2 * (within.high - within.low)
    assert hierarchical.low < 0.1 < 0.3 < hierarchical.high
    same = hierarchical_bootstrap([[0.5] * 10] * 3)  # no noise anywhere: no width
    assert (same.low, same.high) == (0.5, 0.5)


def test_the_t_interval_over_seeds_is_students() -> None:
    interval = t_interval([0.4, 0.0, 0.2])  # mean 0.2, sd 0.2, t(2) 4.303
    assert interval.estimate == pytest.approx(0.2)
    half = 4.303 * 0.2 / 3**0.5
    assert (interval.low, interval.high) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))
    with pytest.raises(ValueError, match="two seeds"):
        t_interval([0.1])


def test_independent_seed_cells_expect_issue_46s_grid(tmp_path: Path) -> None:
    from benchmarks.learning_pool import expected_cells
    from benchmarks.learning_systems import GRID_SEEDS, TASKS

    old = write_run(tmp_path / "a", "sums", 0, ours_right=12, trl_right=6)
    assert expected_cells([old]) == (["sums", "three_sums"], (0, 1, 2))
    new = {**old, "seeds": {"train": 1, "validation": 2, "test": 3}}
    assert expected_cells([new]) == (list(TASKS), GRID_SEEDS)
    assert list(TASKS) == ["sums", "three_sums", "family"]
