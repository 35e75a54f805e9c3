"""What decides benchmarks/learning_vs_trl.py's verdict: the held-out grader, the disjointness of
every training problem from the held-out set (for both systems), the bootstrap interval, the
choice of snapshots, and TRL left at its documented learning defaults.

The runs themselves take minutes (``--minutes``); nothing here times anything.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from atroposlib.envs.heldout import HeldOutOverlapError
from atroposlib.localrun.bootstrap import bootstrap_mean, gain_difference, gains
from atroposlib.utils.health import NotHealthyError
from benchmarks.learning_systems import (
    TASKS,
    Snapshot,
    SnapshotWatcher,
    Task,
    TrlSpec,
    trl_settings,
)


@pytest.fixture(scope="module")
def task() -> Task:
    return Task.load()


# ---- the held-out grader and the shared reward ---------------------------------------------


@pytest.mark.parametrize(
    ("reply", "formatted", "strict", "lenient"),
    [
        ("<answer>{right}</answer>", True, True, True),
        ("  <answer> {right} </answer>\n", True, True, True),
        ("<answer>{wrong}</answer>", True, False, False),
        ("{a} + {b} = {right}", False, False, True),  # the zero-shot style: right, no format
        ("The sum is <answer>{right}</answer>.", False, False, True),  # tag inside prose
        ("{right} <answer>{wrong}</answer>", False, False, False),  # the tag wins
        ("<answer>{right}</answer><answer>{wrong}</answer>", False, False, False),
        ("<think>{right}</think><answer>{right}</answer>", True, True, True),
        ("", False, False, False),
    ],
)
def test_the_held_out_grader(
    task: Task, reply: str, formatted: bool, strict: bool, lenient: bool
) -> None:
    entry = task.test[0]
    a, b = entry["metadata"]["expression"].split(" + ")
    right = entry["answer"]
    text = reply.format(right=right, wrong=int(right) + 1, a=a, b=b)
    graded = task.grade(text, entry)
    assert (graded.formatted, graded.strict, graded.lenient) == (formatted, strict, lenient)


def test_the_reward_is_tagged_correctness_plus_exact_format(task: Task) -> None:
    entry = task.train[0]
    a, b = entry["metadata"]["expression"].split(" + ")
    right, wrong = entry["answer"], str(int(entry["answer"]) + 1)
    weight = task.config.format_weight
    assert weight > 0
    worked = f"<think>{a} + {b} = {right}</think>\n<answer>{right}</answer>"
    rewards = {
        "exact right": (f"<answer>{right}</answer>", 1.0 + weight),
        "worked right": (worked, 1.0 + weight),
        "exact wrong": (f"<answer>{wrong}</answer>", weight),
        "tag in prose": (f"So: <answer>{right}</answer>", 1.0),
        "no tag": (f"<think>{a} + {b} = {right}</think>", 0.0),  # right, but not where asked
        "plain": (f"It is {right}", 0.0),
        "tag spam": (f"Put {right} in <answer> <answer>: tags", 0.0),  # no partial credit to game
    }
    for name, (reply, expected) in rewards.items():
        assert task.reward(reply, entry) == pytest.approx(expected), name


def test_the_prompt_shows_the_worked_examples_before_the_question(task: Task) -> None:
    entry = task.test[0]
    messages = task.prompt(entry)
    assert len(task.config.examples) == 2
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2 + ["user"]
    assert messages[-1]["content"].startswith(entry["question"])
    for message in messages[1:-1:2]:  # each example reply has the exact shape the grader wants
        assert task.grade(message["content"], {"answer": "0", **entry}).formatted


# ---- disjointness ----------------------------------------------------------------------------


def test_no_held_out_problem_is_in_the_pool_either_system_trains_on(task: Task) -> None:
    held_out = {task.key(e) for e in task.test}
    pool = {task.key(e) for e in task.train}  # ours draws from it; TRL's dataset is exactly it
    assert len(held_out) == len(task.test) >= 200
    assert not held_out & pool
    swapped = set()
    for entry in task.test:  # a + b and b + a are the same problem
        a, b = entry["metadata"]["expression"].split(" + ")
        swapped.add(f"Calculate {b} + {a}.")
    assert not swapped & {e["question"] for e in task.train}
    shown = task.module.example_keys(task.config)  # the prompt's worked examples count as seen
    assert len(shown) == len(task.config.examples) and not held_out & shown
    check = task.disjointness
    assert (check.overlap, check.eval_problems, check.training_pool) == (0, 200, len(pool | shown))


def test_a_worked_example_is_never_evaluated_even_if_its_problem_is_held_out(task: Task) -> None:
    first = task.test[0]
    a, b = first["metadata"]["expression"].split(" + ")
    example = (f"Calculate {b} + {a}.", f"<answer>{first['answer']}</answer>")  # the same fact
    config = task.module.ReasoningGymConfig(**{**task.config.model_dump(), "examples": [example]})
    problems = task.module.build_problems(config)
    keys = [task.key(e) for e in problems.test["basic_arithmetic"]]
    assert task.key(first) not in keys and len(keys) == len(set(keys)) == config.eval_size
    assert task.key(first) in task.module.example_keys(config)


def test_a_held_out_set_that_meets_the_training_pool_is_refused(task: Task) -> None:
    settings = {
        **task.config.model_dump(),
        "held_out_fraction": 0.0,
        "task_configs": {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "max_digits": 1,
                                              "operators": ["+"]}},
        "eval_size": 20,
        "dataset_size": 400,
    }  # fmt: skip
    with pytest.raises(HeldOutOverlapError, match="in the training pool"):
        task.module.build_problems(task.module.ReasoningGymConfig(**settings))


# ---- the bootstrap interval ------------------------------------------------------------------


def test_a_constant_gain_has_a_zero_width_interval() -> None:
    interval = bootstrap_mean([1.0] * 50)
    assert (interval.estimate, interval.low, interval.high) == (1.0, 1.0, 1.0)


def test_the_interval_matches_the_normal_approximation_and_is_reproducible() -> None:
    values = [1.0] * 60 + [0.0] * 140  # p = 0.3 over 200 problems
    interval = bootstrap_mean(values, resamples=20_000, seed=3)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 200)
    assert interval.estimate == pytest.approx(0.3)
    assert interval.low == pytest.approx(0.3 - half, abs=0.01)
    assert interval.high == pytest.approx(0.3 + half, abs=0.01)
    assert bootstrap_mean(values, resamples=20_000, seed=3) == interval


def test_balanced_flips_give_an_interval_around_zero() -> None:
    before = [True] * 20 + [False] * 20 + [True] * 160
    after = [False] * 20 + [True] * 20 + [True] * 160  # 20 right->wrong, 20 wrong->right
    interval = bootstrap_mean(gains(before, after))
    assert interval.estimate == 0.0 and interval.low < 0 < interval.high


def test_the_difference_of_gains_is_taken_problem_by_problem() -> None:
    before = [False, False, True, True]
    ours = [True, True, True, False]
    theirs = [False, True, True, True]
    assert gain_difference(before, ours, theirs) == [1.0, 0.0, 0.0, -1.0]
    with pytest.raises(ValueError, match="same problems"):
        gains([True], [True, False])
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_mean([])


# ---- snapshots and TRL's settings -----------------------------------------------------------


def test_snapshots_are_the_first_pushed_weights_after_each_mark(tmp_path: Path) -> None:
    weights = tmp_path / "checkpoints" / "weights"
    rows = []
    for step, elapsed in ((1, 40.0), (2, 70.0), (3, 100.0), (4, 130.0)):
        (weights / f"step-{step}").mkdir(parents=True)
        (weights / f"step-{step}" / "model.safetensors").write_text(f"weights {step}")
        rows += [{"step": step, "train/loss": 0.1, "train/elapsed_s": elapsed},
                 {"step": step, "sync/seconds": 1.0, "sync/failed": 0}]  # fmt: skip
    watcher = SnapshotWatcher(tmp_path, [60.0, 90.0])
    kept: list[Snapshot] = []
    with (tmp_path / "metrics.jsonl").open("w") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rows[:4]))
    watcher.poll(kept)
    assert [s.step for s in kept] == [2]  # 70 s is the first step done after the 60 s mark
    with (tmp_path / "metrics.jsonl").open("a") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rows[4:]))
    watcher.poll(kept, final=True)
    assert [(s.step, s.elapsed_s) for s in kept] == [(2, 70.0), (3, 100.0), (4, 130.0)]
    for step in (2, 3, 4):  # hard links: the trainer pruning its folder cannot take them
        for file in (weights / f"step-{step}").iterdir():
            file.unlink()
        assert (tmp_path / "snapshots" / f"step-{step}" / "model.safetensors").read_text() == (
            f"weights {step}"
        )


def test_trl_keeps_its_documented_learning_defaults(task: Task, tmp_path: Path) -> None:
    from trl import GRPOConfig

    spec = TrlSpec(str(tmp_path), "model", 1.0, 0, [], 1)
    settings = trl_settings(task, spec)
    config = GRPOConfig(**settings)
    assert (config.loss_type, config.scale_rewards) == ("dr_grpo", "none")  # the same family
    assert config.max_completion_length == task.max_tokens
    defaults = GRPOConfig(output_dir=str(tmp_path / "defaults"), use_cpu=True)
    for name in ("learning_rate", "num_generations", "per_device_train_batch_size",
                 "temperature", "epsilon", "beta", "num_iterations", "top_p"):  # fmt: skip
        assert getattr(config, name) == getattr(defaults, name), name


# ---- resuming an evaluation ------------------------------------------------------------------


def test_a_model_already_graded_is_read_back_not_generated_again(
    task: Task, tmp_path: Path
) -> None:
    from benchmarks.learning_vs_trl import evaluate

    rows = [{"problem": task.key(e), "strict": i % 2 == 0, "lenient": True, "formatted": i < 3}
            for i, e in enumerate(task.test)]  # fmt: skip
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    missing_model = tmp_path / "no-model"  # generating would fail: nothing can be served
    graded = evaluate(task, None, missing_model, tmp_path, 1)
    assert graded.rate("strict") == 0.5 and graded.rate("formatted") == 3 / 200
    (tmp_path / "base.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    with pytest.raises(NotHealthyError, match="before it answered"):  # other problems: generates
        evaluate(task, None, missing_model, tmp_path, 1)


def test_eval_only_needs_the_systems_training_records(tmp_path: Path) -> None:
    from benchmarks.learning_vs_trl import main

    assert main(["--eval-only", "--run-dir", str(tmp_path), "--only", "trl", "--no-publish"]) == 1


def test_a_run_folder_resumes_only_with_the_settings_it_was_started_with(tmp_path: Path) -> None:
    from benchmarks.learning_vs_trl import claim_run_dir, parse_args

    first = parse_args(["--minutes", "10", "--seed", "1"])
    assert claim_run_dir(tmp_path, first) is None  # new: claimed
    assert claim_run_dir(tmp_path, parse_args(["--minutes", "10", "--seed", "1"])) is None
    refused = claim_run_dir(tmp_path, parse_args(["--minutes", "5", "--seed", "1"]))
    assert refused is not None and "minutes 10.0 -> 5.0" in refused and "--run-dir" in refused
    assert json.loads((tmp_path / "invocation.json").read_text())["minutes"] == 10.0


def test_the_machine_line_names_the_cpu_and_the_flags_that_set_its_speed(tmp_path: Path) -> None:
    from benchmarks.learning_vs_trl import machine_line

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma\n")
    simd = "has avx2; lacks avx512f, avx512_bf16, avx512_vnni, amx_bf16, amx_tile"
    assert f"AMD EPYC 7B13 ({simd})" in machine_line(cpuinfo)
    assert "CPUs" in machine_line(tmp_path / "missing")  # not Linux: still a line, no error


def test_a_finished_task_is_published_with_what_the_pool_reads(tmp_path: Path) -> None:
    from benchmarks.learning_pool import load_summaries
    from benchmarks.learning_vs_trl import publish

    run = tmp_path / "run" / "sums"
    (run / "eval").mkdir(parents=True)
    for name in ("table.txt", "accuracy_vs_minutes.png", "invocation.json",
                 "ours-training.json", "trl-training.json"):  # fmt: skip
        (run / name).write_text(name)
    for label in ("base", "ours-step-3", "trl-step-2", "ours-step-1"):
        (run / "eval" / f"{label}.jsonl").write_text(json.dumps({"strict": True}) + "\n")
    summary = {"task": "sums", "seed": 2, "run_dir": str(run), "systems": {}}
    folder = publish(run, summary, ["base", "ours-step-3", "trl-step-2"], tmp_path / "grid")
    assert folder == tmp_path / "grid" / "sums-seed2"
    assert sorted(p.name for p in (folder / "eval").iterdir()) == [
        "base.jsonl", "ours-step-3.jsonl", "trl-step-2.jsonl"]  # fmt: skip
    assert (folder / "table.txt").read_text() == "table.txt"
    assert load_summaries([tmp_path / "grid"])[0]["run_dir"] == str(folder)


@pytest.mark.slow
def test_the_served_evaluator_answers_as_transformers_generate_does(
    task: Task, tmp_path: Path
) -> None:
    """The benchmark's evaluator (atropos-local's: the embedded server's fast path) against
    the old one (transformers' batched ``generate``), greedy, on the same base weights."""
    from atroposlib.utils.test_model import ensure_test_model
    from benchmarks.learning_systems import greedy_replies, served_greedy_answers

    model, count = ensure_test_model(), 24
    served = served_greedy_answers(model, task, tmp_path / "served", threads=2, eval_size=count)
    prompts = [task.prompt(e) for e in task.test[:count]]
    generated = greedy_replies(model, model, prompts, task.max_tokens, batch_size=count)
    assert [a["problem"] for a in served] == [task.key(e) for e in task.test[:count]]
    differing = [(a["response"], r) for a, r in zip(served, generated, strict=True)
                 if a["response"] != r]  # fmt: skip
    assert not differing, differing
    grades = [task.grade(r, e).strict for r, e in zip(generated, task.test[:count], strict=True)]
    assert [a["strict"] for a in served] == grades


# ---- the tasks -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_holds_out_200_problems_none_of_them_trainable(name: str) -> None:
    task = Task.load(TASKS[name])
    assert len(task.test) == 200 == task.disjointness.eval_problems
    assert task.disjointness.overlap == 0 and task.disjointness.training_pool > 1000
    train_keys = {task.key(e) for e in task.train}
    assert not train_keys & {task.key(e) for e in task.test}


def test_the_second_task_is_three_terms_with_the_same_prompt_shape() -> None:
    first, second = Task.load(TASKS["sums"]), Task.load(TASKS["three_sums"])
    entry = second.test[0]
    assert entry["question"].count("+") == 2 and "+" in first.test[0]["question"]
    weight = second.config.format_weight
    assert weight == first.config.format_weight  # one reward on both tasks
    assert second.reward(f"<answer>{entry['answer']}</answer>", entry) == 1.0 + weight
    assert second.reward("<answer>-1</answer>", entry) == weight  # the format alone
    assert len(second.prompt(entry)) == len(first.prompt(first.test[0]))


def test_ours_trains_in_fp32_as_trls_side_does(tmp_path: Path) -> None:
    """TRL's side runs fp32 (``bf16: False``); atropos-local's default would pick bf16 on a CPU
    with native bf16, so ours' command pins fp32 and atropos-local's own parser reads it so."""
    from atroposlib.cli.local import parse_settings
    from benchmarks.learning_systems import ours_command

    command = ours_command(tmp_path / "run", 10.0, 1)
    assert command[1:3] == ["-m", "atroposlib.cli.local"]
    assert parse_settings(command[3:]).precision == "fp32"
