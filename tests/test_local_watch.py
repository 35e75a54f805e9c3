"""A run that says it is going wrong: the warnings as tables, the best weights kept by
held-out strict accuracy, the warnings on the plain lines and in the summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from atroposlib.launcher import Supervisor
from atroposlib.localrun import report
from atroposlib.localrun.components import RunLayout
from atroposlib.localrun.panel import PlainLines, RunStatus, StatusPoller
from atroposlib.localrun.periodic import GroupFlags, RunWatch
from atroposlib.localrun.settings import LocalRunSettings
from atroposlib.localrun.watch import (
    Snapshot,
    accuracy_warning,
    best_snapshot,
    dropped_groups_warning,
    failing_groups,
    over_budget_warning,
)


def snap(step: int, strict: float) -> Snapshot:
    return Snapshot(step, step, strict, strict, 1.0, 1.0)


@pytest.mark.parametrize(
    ("stricts", "warned"),
    [
        ([], False),
        ([0.10], False),
        ([0.10, 0.30, 0.35], False),  # still rising
        ([0.10, 0.30, 0.20], False),  # exactly 10 points below: not more than the threshold
        ([0.10, 0.30, 0.19], True),
        ([0.45, 0.05, 0.40], False),  # recovered to within 10 points of the best
        ([0.09, 0.05, 0.005], False),  # the issue's collapse in percent: 8.5 points
    ],
)
def test_accuracy_warning_when_well_below_the_best(stricts: list[float], warned: bool) -> None:
    snapshots = [snap(5 * i, s) for i, s in enumerate(stricts)]
    warning = accuracy_warning(snapshots, drop=0.10)
    assert (warning is not None) == warned
    if warning:
        assert f"at step {snapshots[-1].step}" in warning and "best, 30.0 % at step 5" in warning


def test_the_default_threshold_catches_the_issues_collapse() -> None:
    snapshots = [snap(0, 0.045), snap(10, 0.09), snap(20, 0.005)]
    warning = accuracy_warning(snapshots, drop=LocalRunSettings().eval_drop_warning)
    assert warning is not None and "8.5 points below its best, 9.0 % at step 10" in warning


def test_the_best_snapshot_is_the_earliest_of_equals() -> None:
    assert best_snapshot([]) is None
    snapshots = [snap(0, 0.1), snap(5, 0.4), snap(10, 0.4), snap(15, 0.2)]
    assert best_snapshot(snapshots) == snapshots[1]


@pytest.mark.parametrize(
    ("first", "latest", "groups", "warned"),
    [
        (0.5, 0.9, 80, True),
        (0.5, 0.9, 79, False),  # fewer than two windows: too early to compare
        (0.7, 0.95, 80, False),  # high from the start: a rise of 0.25 only
        (0.2, 0.75, 80, False),  # below the share that warns
        (0.0, 0.8, 120, True),
    ],
)
def test_dropped_groups_warning_when_the_share_explodes(
    first: float, latest: float, groups: int, warned: bool
) -> None:
    window = 40
    head = [i < first * window for i in range(window)]
    tail = [i < latest * window for i in range(window)]
    flags = head + [False] * max(0, groups - 2 * window) + tail
    flags = flags[len(flags) - groups :]
    warning = dropped_groups_warning(flags, share=0.8, window=window)
    assert (warning is not None) == warned
    if warning:
        assert f"{100 * latest:.0f} % of the last 40 groups" in warning


def test_group_flags_read_only_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    flags = GroupFlags(path)
    assert flags.read() == []
    path.write_text('{"scores": [1, 0]}\n{"scores": [1, 1], "dropped": "all equal"}\n{"sco')
    assert flags.read() == [(False, 0.5), (True, 1.0)]
    with path.open("a") as handle:
        handle.write('res": [0, 0], "dropped": "all equal"}\n')
    assert flags.read() == [(False, 0.5), (True, 1.0), (True, 0.0)]
    assert failing_groups(flags.read()) == [False, False, True]


@pytest.mark.parametrize(
    ("longest", "expected"),
    [
        ([], None),
        ([0] * 50, None),
        ([0] * 39 + [274], "1 of the last 40 groups were not sent: a sequence of up to 274"),
        ([300] + [0] * 40, None),  # long ago: out of the latest 40
        ([274, 300], "2 of the last 2 groups were not sent: a sequence of up to 300 tokens"),
    ],
)
def test_over_budget_warning_names_the_longest_sequence_and_the_fix(
    longest: list[int], expected: str | None
) -> None:
    warning = over_budget_warning(longest, budget=256)
    if expected is None:
        assert warning is None
    else:
        assert warning is not None and warning.startswith(expected)
        assert "over max_token_len 256" in warning and "--max-token-len" in warning


def test_a_group_over_the_budget_is_no_dropped_group_but_its_longest_sequence_is_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rollouts.jsonl"
    too_long = {"scores": [1, 0], "tokens": [[1] * 5, [1] * 9],
                "dropped": "a sequence has 9 tokens, over max_token_len 8"}  # fmt: skip
    path.write_text(json.dumps(too_long) + '\n{"scores": [1, 1], "dropped": "all equal"}\n')
    flags = GroupFlags(path)
    assert flags.read() == [(False, 0.5), (True, 1.0)]
    assert flags.over_budget == [9, 0]


def test_groups_dropped_because_the_task_is_solved_do_not_warn() -> None:
    start = [(i % 2 == 0, 0.5) for i in range(40)] + [(False, 1.0)]
    solved = [(True, 1.5)] * 40  # every reply right and well formed: the best reward
    collapsed = [(False, 1.5)] + [(True, 0.5)] * 40  # the format reward alone
    assert dropped_groups_warning(failing_groups(start + solved), share=0.8) is None
    warning = dropped_groups_warning(failing_groups(start + collapsed), share=0.8)
    assert warning is not None and warning.startswith("100 % of the last 40 groups")


def write_eval(folder: Path, strict: float) -> None:
    folder.mkdir(parents=True)
    metrics = {"eval/strict": strict, "eval/lenient": strict + 0.25, "eval/formatted": 0.9}
    written = {"config_general": {"total_evaluation_time_seconds": "12.34"},
               "results": {"all": metrics}}  # fmt: skip
    (folder / "metrics.json").write_text(json.dumps(written))


def push_weights(layout: RunLayout, version: int) -> Path:
    folder = layout.checkpoints / "weights" / f"step-{version}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(bytes([version]) * 64)
    (folder / "config.json").write_text("{}")
    return folder


def test_the_best_weights_are_kept_by_strict_accuracy_and_a_drop_warns(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path, "base-model", 1, 2)
    http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(503)))
    poller = StatusPoller(layout, http)
    with Supervisor(tmp_path, http=http) as supervisor:
        watch = RunWatch(LocalRunSettings(), layout, supervisor, poller)
        for label, step, strict in (("before", 0, 0.10), ("step2", 2, 0.40), ("step4", 4, 0.25)):
            write_eval(layout.eval_dir(label), strict)
            if step:
                pushed = push_weights(layout, step)
            watch.record(layout.eval_dir(label), step, step)
            if step == 2:
                best = layout.checkpoints / "best"
                kept = best / "model.safetensors"
                assert kept.read_bytes() == bytes([2]) * 64
                assert kept.stat().st_ino == (pushed / "model.safetensors").stat().st_ino
                assert json.loads((best / "held_out.json").read_text())["step"] == 2
                (layout.checkpoints / "weights" / "step-2").rename(tmp_path / "pruned")
        watch.tick()  # no trainer step yet: starts nothing, refreshes the warnings
    assert (layout.checkpoints / "best" / "model.safetensors").read_bytes() == bytes([2]) * 64
    assert sorted(p.name for p in layout.checkpoints.iterdir()) == ["best", "weights"]
    assert poller.status.best_held_out == Snapshot(2, 2, 0.40, 0.65, 0.9, 12.3)
    (warning,) = poller.status.warnings
    assert "25.0 % at step 4 is 15.0 points below its best, 40.0 % at step 2" in warning
    summary = watch.summary()
    assert [s["step"] for s in summary["held_out_snapshots"]] == [0, 2, 4]
    assert summary["best_held_out"]["weights"] == str(layout.checkpoints / "best")
    assert summary["warnings"] == [warning]
    assert summary["warnings_raised"] == [{"step": 0, "warning": warning}]
    lines = report.snapshot_lines(summary)
    assert lines[0] == "held-out strict by step: step 0 10.0 %, step 2 40.0 %, step 4 25.0 %"
    assert lines[-1] == f"WARNING (step 0): {warning}"


def test_when_the_base_model_stays_best_no_weights_are_kept(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path, "base-model", 1, 2)
    http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(503)))
    poller = StatusPoller(layout, http)
    with Supervisor(tmp_path, http=http) as supervisor:
        watch = RunWatch(LocalRunSettings(), layout, supervisor, poller)
        for label, step, strict in (("before", 0, 0.30), ("after", 3, 0.30)):
            write_eval(layout.eval_dir(label), strict)
            if step:
                push_weights(layout, step)
            watch.record(layout.eval_dir(label), step, step)
    assert sorted(p.name for p in layout.checkpoints.iterdir()) == ["weights"]
    assert watch.summary()["best_held_out"]["weights"] == "the base model (base-model)"


def test_a_best_snapshot_whose_weights_folder_was_gone_says_so(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path, "base-model", 1, 2)
    http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(503)))
    with Supervisor(tmp_path, http=http) as supervisor:
        watch = RunWatch(LocalRunSettings(), layout, supervisor, StatusPoller(layout, http))
        write_eval(layout.eval_dir("step2"), 0.5)
        watch.record(layout.eval_dir("step2"), 2, 2)  # no checkpoints/weights/step-2
    best = watch.summary()["best_held_out"]
    assert best["step"] == 2
    assert best["weights"] == "not kept: no folder checkpoints/weights/step-2"
    assert not (layout.checkpoints / "best").exists()


def test_periodic_evaluation_needs_held_out_problems() -> None:
    with pytest.raises(ValueError, match="--eval-every-steps needs held-out problems"):
        LocalRunSettings(eval_every_steps=5, eval_size=0)


def test_a_new_warning_is_written_at_once_on_the_plain_lines() -> None:
    now, out = [0.0], []
    lines = PlainLines(out.append, 40, 30.0, clock=lambda: now[0])
    status = RunStatus(phase="training")
    lines.update(status)
    now[0] = 5.0
    status.warnings = ["held-out strict accuracy fell"]
    lines.update(status)
    now[0] = 6.0
    lines.update(status)  # the same warning: no new line before the interval
    assert len(out) == 2
    assert out[0].endswith("| warning none")
    assert out[1].endswith("| warning held-out strict accuracy fell")


@pytest.mark.slow
def test_a_run_evaluates_during_training_and_records_every_snapshot(
    tmp_path: Path, test_model_path: Path, subprocess_env: dict[str, str]
) -> None:
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "atroposlib.cli.local", "--run-dir", str(run_dir),
         "--model", str(test_model_path), "--steps", "4", "--batch-size", "8",
         "--group-size", "4", "--eval-size", "4", "--eval-every-steps", "2",
         "--progress-interval-s", "5"],
        env=subprocess_env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    snapshots = summary["held_out_snapshots"]
    steps = [s["step"] for s in snapshots]
    assert steps[0] == 0 and steps[-1] == 4  # before and after training
    assert len(steps) == 3 and 2 <= steps[1] < 4  # one while the trainer stepped
    assert (run_dir / f"eval_step{steps[1]}" / "samples.jsonl").exists()
    assert all(0 <= s[k] <= 1 for s in snapshots for k in ("strict", "lenient", "format"))
    best = summary["best_held_out"]
    assert best["strict"] == max(s["strict"] for s in snapshots)
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "best").exists() == (best["step"] > 0)
    if best["step"] > 0:
        kept = json.loads((checkpoints / "best" / "held_out.json").read_text())
        assert kept["step"] == best["step"]
    assert not [p for p in checkpoints.iterdir() if p.name.startswith(".held-out")]
    assert isinstance(summary["warnings"], list)
    assert "held-out strict by step: step 0 " in result.stdout
    training = [line for line in result.stdout.splitlines() if line.startswith("training |")]
    assert training and all(
        " held-out strict " in line and " warning " in line for line in training
    )


def test_a_dropped_groups_warning_is_raised_once_while_its_share_moves(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path, "base-model", 1, 2)
    http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(503)))
    poller = StatusPoller(layout, http)

    def write(groups: list[tuple[bool, float]]) -> None:
        with layout.rollouts_file.open("a") as out:
            for dropped, reward in groups:
                out.write(json.dumps({"dropped": dropped, "scores": [reward] * 4}) + "\n")

    with Supervisor(tmp_path, http=http) as supervisor:
        watch = RunWatch(LocalRunSettings(), layout, supervisor, poller)
        write([(i % 2 == 0, 0.5) for i in range(40)] + [(False, 1.5)] * 40)
        shown = []
        for _ in range(12):  # the collapsed state: its share of the last 40 climbs group by group
            write([(True, 0.5)] * 3)
            watch.tick()
            shown.append(list(poller.status.warnings))
        raised = list(watch.warnings_raised)
        write([(False, 1.0)] * 40)  # it clears ...
        watch.tick()
        cleared = list(poller.status.warnings)
        write([(True, 0.5)] * 40)  # ... and comes back: news again
        watch.tick()
    assert len(raised) == 1 and raised[0]["warning"].startswith("82 % of the last 40 groups")
    assert shown[-1] == [raised[0]["warning"]]  # kept as raised, not re-worded per group
    assert cleared == []
    assert len(watch.warnings_raised) == 2


def test_a_run_whose_groups_are_too_long_says_so_and_stops_saying_it_once_they_fit(
    tmp_path: Path,
) -> None:
    layout = RunLayout(tmp_path, "base-model", 1, 2)
    http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(503)))
    poller = StatusPoller(layout, http)

    def write(longest: int, count: int) -> None:
        reason = f"a sequence has {longest} tokens, over max_token_len 256"
        group = {"scores": [1, 0], "tokens": [[1] * longest, [1] * 10]}
        with layout.rollouts_file.open("a") as out:
            for _ in range(count):
                out.write(json.dumps({**group, **({"dropped": reason} if longest > 256 else {})}))
                out.write("\n")

    with Supervisor(tmp_path, http=http) as supervisor:
        watch = RunWatch(LocalRunSettings(max_token_len=256), layout, supervisor, poller)
        watch.tick()
        assert poller.status.warnings == []
        write(274, 1)  # the first group of a task whose prompts outgrow the budget
        watch.tick()
        raised = list(poller.status.warnings)
        write(274, 5)
        watch.tick()
        kept = list(poller.status.warnings)
        write(200, 40)  # the budget raised: they fit
        watch.tick()
    assert len(raised) == 1 and raised[0].startswith("1 of the last 1 groups were not sent")
    assert "274 tokens, over max_token_len 256" in raised[0]
    assert kept == raised and len(watch.warnings_raised) == 1
    assert poller.status.warnings == []
    assert watch.summary()["warnings_raised"][0]["warning"] == raised[0]


def test_an_evaluation_of_the_final_weights_during_training_is_the_one_after(
    tmp_path: Path,
) -> None:
    layout = RunLayout(tmp_path, "base-model", 1, 2)
    http = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(503)))
    with Supervisor(tmp_path, http=http) as supervisor:
        watch = RunWatch(LocalRunSettings(), layout, supervisor, StatusPoller(layout, http))
        write_eval(layout.eval_dir("before"), 0.10)
        watch.record(layout.eval_dir("before"), 0, 0)
        assert not watch.reuse_for_after(0)  # the base model is no evaluation after training
        write_eval(layout.eval_dir("step6"), 0.30)
        push_weights(layout, 6)
        watch.record(layout.eval_dir("step6"), 6, 6)
        assert not watch.reuse_for_after(7)  # the weights moved on since
        assert not layout.eval_dir("after").exists()
        assert watch.reuse_for_after(6)
    after = json.loads((layout.eval_dir("after") / "metrics.json").read_text())
    assert after["results"]["all"]["eval/strict"] == 0.30
    assert [s.step for s in watch.snapshots] == [0, 6]  # not counted twice
