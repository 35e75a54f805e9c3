"""reasoning_gym and letter_counting: scoring tables, config checks, ``process`` end to end."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import reasoning_gym
from envcat_testlib import ENVIRONMENTS, REPO_ROOT, load_env_module, process_groups, run_env

from atroposlib.envs.heldout import HeldOutOverlapError, HeldOutTooSmallError

rg_env = load_env_module("reasoning_gym")
lc_env = load_env_module("letter_counting")

ENTRY_DS = reasoning_gym.create_dataset("basic_arithmetic", size=1, seed=3, max_terms=2)
ENTRY = ENTRY_DS[0]
RIGHT = ENTRY["answer"]


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        (f"<answer>{RIGHT}</answer>", 1.2),  # right and well formed
        (f"<think>easy</think><answer>{RIGHT}</answer>", 1.2),
        (f"The answer: <answer>{RIGHT}</answer>", 1.0),  # right, extra text: no format bonus
        ("<answer>abc</answer>", 0.2),  # wrong, well formed
        (RIGHT, 0.0),  # right number but no tags
        ("<answer></answer>", 0.2),  # empty answer
        ("", 0.0),  # empty reply
        (f"<think><answer>{RIGHT}</answer></think>", 0.0),  # adversarial: answer hidden in think
        (f"<answer>{RIGHT}</answer><answer>1</answer>", 0.0),  # adversarial: two answers, last wins
    ],
)
def test_reasoning_gym_score_table(reply: str, score: float) -> None:
    assert rg_env.score_reply(reply, ENTRY, ENTRY_DS, 0.2) == pytest.approx(score)


WRONG = str(int(float(RIGHT)) + 1)


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        (f"So the result is {RIGHT}.", 1.0),  # no tags: the final number is graded
        (f"It is {WRONG}, no wait, {RIGHT}", 1.0),  # the last number counts
        (f"{RIGHT} plus nothing gives {WRONG}", 0.0),
        (f"<answer>{RIGHT}</answer>", 1.5),  # a tag still earns the format weight
        (f"{RIGHT} <answer>{WRONG}</answer>", 0.0),  # a tag wins over loose numbers
        ("no number at all", 0.0),
    ],
)
def test_reasoning_gym_lenient_grading_reads_the_final_number(reply: str, score: float) -> None:
    assert rg_env.score_reply(reply, ENTRY, ENTRY_DS, 0.5, lenient=True) == pytest.approx(score)


def test_reasoning_gym_config_rejects_unknown_tasks_with_a_fix() -> None:
    with pytest.raises(ValueError, match="basic_arithmetic"):
        rg_env.ReasoningGymConfig(tasks={"basic_arithmetik": 1.0})
    with pytest.raises(ValueError, match="weights must be > 0"):
        rg_env.ReasoningGymConfig(tasks={"basic_arithmetic": 0.0})


async def test_reasoning_gym_mix_follows_weights_and_difficulty() -> None:
    config = rg_env.ReasoningGymConfig(
        tasks={"basic_arithmetic": 3.0, "letter_counting": 1.0},
        task_configs={"basic_arithmetic": {"min_digits": 3, "max_digits": 3, "max_terms": 2}},
        dataset_size=50,
        eval_size=2,
    )
    env = object.__new__(rg_env.ReasoningGymEnv)
    env.config = config
    await rg_env.ReasoningGymEnv.setup(env)
    items = [await rg_env.ReasoningGymEnv.get_next_item(env) for _ in range(400)]
    share = sum(i["task"] == "basic_arithmetic" for i in items) / len(items)
    assert 0.68 < share < 0.82
    arithmetic = [i["entry"] for i in items if i["task"] == "basic_arithmetic"]
    assert all(e["metadata"]["num_digits"] == 3 for e in arithmetic)


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("<answer>3</answer>", 1.2),
        ("<answer> 3 </answer>", 1.2),
        ("<answer>3.0</answer>", 1.2),
        ("<think>s-t-r</think><answer>3</answer>", 1.2),
        ("<answer>2</answer>", 0.2),
        ("<answer>three</answer>", 0.2),
        ("3", 0.0),
        ("", 0.0),
        ("<answer>3</answer> or <answer>2</answer>", 0.0),
        ("<answer>3", 0.0),
    ],
)
def test_letter_count_reward_table(reply: str, score: float) -> None:
    assert lc_env.letter_count_reward([reply], ["3"]) == [pytest.approx(score)]


def test_letter_questions_are_right_and_follow_difficulty() -> None:
    config = lc_env.LetterCountingConfig(min_words=3, max_words=3, random_words=True)
    rng = random.Random(5)
    for _ in range(50):
        row = lc_env.make_question(rng, config)
        letter, text = row["question"].split("'")[1], row["question"].split("'")[3]
        assert len(text.split()) == 3
        assert row["answer"] == str(text.count(letter))


@pytest.mark.slow
def test_reasoning_gym_process_end_to_end(scripted, tmp_path: Path) -> None:
    dataset = reasoning_gym.create_dataset("basic_arithmetic", size=2, seed=0)
    rules = [
        {"when": entry["question"], "replies": [f"<answer>{entry['answer']}</answer>",
                                                  entry["answer"], "<answer>99999</answer>", ""]}
        for entry in dataset
    ]  # fmt: skip
    server = scripted(rules)
    groups = process_groups("reasoning_gym", server, tmp_path, "--env.group_size=4",
                            "--env.dataset_size=2", "--env.eval_size=1")  # fmt: skip
    assert [g["scores"] for g in groups] == [[1.2, 0.0, 0.2, 0.0]] * 2
    asked = {g["messages"][0][1]["content"] for g in groups}
    assert asked == {entry["question"] for entry in dataset}


@pytest.mark.slow
def test_letter_counting_process_and_evaluate(scripted, tmp_path: Path) -> None:
    server = scripted([{"when": "'e' appear in 'pepper'", "replies": ["<answer>2</answer>", "2"]},
                       {"when": "", "replies": ["<answer>1</answer>"]}])  # fmt: skip
    groups = process_groups("letter_counting", server, tmp_path, "--env.group_size=2")
    pepper = [g for g in groups if "'pepper'" in g["messages"][0][1]["content"]]
    assert [g["scores"] for g in pepper] == [[1.2, 0.0]]
    done = run_env("letter_counting", "evaluate", server, tmp_path, "--env.eval_size=5",
                   f"--env.data_dir_to_save_evals={tmp_path / 'ev'}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "eval/accuracy" in (tmp_path / "ev" / "metrics.json").read_text()


def test_configs_parse(tmp_path: Path) -> None:
    for name in ("reasoning_gym", "letter_counting"):
        assert (ENVIRONMENTS / name / "config.yaml").exists()


TWO_DIGIT_SUMS = {
    "min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2,
    "operators": ["+"], "allow_parentheses": False, "allow_negation": False,
}  # fmt: skip


async def set_up(**config: object) -> object:
    env = object.__new__(rg_env.ReasoningGymEnv)
    env.config = rg_env.ReasoningGymConfig(**config)
    await rg_env.ReasoningGymEnv.setup(env)
    return env


async def test_held_out_problems_are_distinct_and_never_in_the_training_pool() -> None:
    env = await set_up(task_configs={"basic_arithmetic": TWO_DIGIT_SUMS}, eval_size=200)
    held_out, train = env.test["basic_arithmetic"], env.train["basic_arithmetic"]
    keys = {rg_env.entry_key(e) for e in held_out}
    assert len(held_out) == len(keys) == 200
    assert not keys & {rg_env.entry_key(e) for e in train}
    assert not {e["question"] for e in held_out} & {e["question"] for e in train}
    assert len(train) == env.config.dataset_size
    assert (env.disjointness.eval_problems, env.disjointness.overlap) == (200, 0)
    items = [await rg_env.ReasoningGymEnv.get_next_item(env) for _ in range(300)]
    assert not keys & {rg_env.entry_key(i["entry"]) for i in items}


async def test_a_held_out_set_that_would_meet_training_refuses_to_start() -> None:
    one_digit = {**TWO_DIGIT_SUMS, "min_digits": 1, "max_digits": 1, "operators": ["+", "-"]}
    with pytest.raises(HeldOutOverlapError, match="are in the training pool"):
        await set_up(task_configs={"basic_arithmetic": one_digit}, held_out_fraction=0.0)
    with pytest.raises(HeldOutTooSmallError, match="too small for this eval size"):
        await set_up(task_configs={"basic_arithmetic": one_digit}, eval_size=200)


@pytest.mark.slow
def test_evaluate_reports_strict_lenient_format_and_the_overlap(scripted, tmp_path: Path) -> None:
    rules = [{"when": "Calculate", "replies": ["<answer>999</answer>"]}]
    flags = ["--config", str(REPO_ROOT / "configs" / "local-cpu-env.yaml"), "--env.eval_size=20",
             f"--env.data_dir_to_save_evals={tmp_path / 'ev'}"]  # fmt: skip
    done = run_env("reasoning_gym", "evaluate", scripted(rules), tmp_path, *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/formatted"] == 1.0 and metrics["eval/strict"] == 0.0
    assert metrics["eval/distinct_problems"] == 20.0
    assert metrics["eval/overlap_with_training_pool"] == 0.0
    assert metrics["eval/training_pool_problems"] > 1000
    assert json.loads((tmp_path / "ev" / "progress.json").read_text()) == {"done": 20, "total": 20}
    assert "evaluation: 20/20 answered" in done.stderr
    samples = [json.loads(line) for line in (tmp_path / "ev" / "samples.jsonl").open()]
    assert len({s["problem"] for s in samples}) == 20


def test_refusal_reaches_the_user_as_one_line(scripted, tmp_path: Path) -> None:
    one_digit = json.dumps({"basic_arithmetic": {**TWO_DIGIT_SUMS, "min_digits": 1,
                                                 "max_digits": 1}})  # fmt: skip
    done = run_env("reasoning_gym", "evaluate", scripted([]), tmp_path,
                   f"--env.task_configs={one_digit}", "--env.held_out_fraction=0")  # fmt: skip
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "evaluation problems are in the training pool" in last


@pytest.mark.parametrize(
    ("expression", "carries"),
    [("12 + 35", 0), ("68 + 29", 1), ("50 + 50", 1), ("47 + 77", 2), ("99 + 1", 2),
     ("5 + 5 + 5", 1), ("999 + 1", 3)],
)  # fmt: skip
def test_a_sums_kind_counts_its_column_carries(expression: str, carries: int) -> None:
    entry = {"metadata": {"expression": expression, "num_terms": 2, "num_digits": 2}}
    kind = rg_env.problem_kind("basic_arithmetic", entry)
    assert kind == f"basic_arithmetic num_digits=2 num_terms=2 carries={carries}"


def test_other_tasks_are_kinds_by_their_sizes_alone() -> None:
    [entry] = reasoning_gym.create_dataset("leg_counting", size=1, seed=1)
    kind = rg_env.problem_kind("leg_counting", entry)
    assert kind == f"leg_counting num_animals={entry['metadata']['num_animals']}"
    minus = {"metadata": {"expression": "47 - 7", "num_terms": 2}}
    assert rg_env.problem_kind("basic_arithmetic", minus) == "basic_arithmetic num_terms=2"


def test_screening_is_refused_where_it_could_send_short_groups_or_screen_nothing() -> None:
    with pytest.raises(ValueError, match="set ensure_scores_are_not_same true"):
        rg_env.ReasoningGymConfig(group_size=4, screen_replies=2, ensure_scores_are_not_same=False)
    with pytest.raises(ValueError, match="screen fewer replies than the group has"):
        rg_env.ReasoningGymConfig(group_size=4, screen_replies=4, ensure_scores_are_not_same=True)
    config = rg_env.ReasoningGymConfig(group_size=4, screen_replies=2,
                                       ensure_scores_are_not_same=True)  # fmt: skip
    assert config.screen_replies == 2


async def test_selection_by_signal_skips_the_kind_that_stopped_teaching() -> None:
    env = await set_up(task_configs={"basic_arithmetic": TWO_DIGIT_SUMS}, select_by_signal=True,
                       selection_window=16, selection_floor=0.1)  # fmt: skip
    kinds = [rg_env.problem_kind("basic_arithmetic", {"metadata": {"expression": e,
             "num_terms": 2, "num_digits": 2}}) for e in ("12 + 35", "68 + 29")]  # fmt: skip
    no_carry, one_carry = kinds
    for _ in range(16):
        env.selector.record(no_carry, [1.1, 1.1, 1.1, 1.1])  # always solved
        env.selector.record(one_carry, [1.1, 0.0, 0.1, 1.1])
    items = [await rg_env.ReasoningGymEnv.get_next_item(env) for _ in range(300)]
    drawn = [rg_env.problem_kind("basic_arithmetic", item["entry"]) for item in items]
    natural = reasoning_gym.create_dataset("basic_arithmetic", size=300, seed=9, **TWO_DIGIT_SUMS)
    natural_share = sum(rg_env.problem_kind("basic_arithmetic", e) == no_carry
                        for e in natural) / 300  # fmt: skip
    assert natural_share > 0.25, "sums without a carry are common"
    assert drawn.count(no_carry) / len(drawn) < natural_share / 3
    assert env.selector.skipped > 0


async def test_a_problem_whose_group_taught_is_drawn_again() -> None:
    env = await set_up(task_configs={"basic_arithmetic": TWO_DIGIT_SUMS}, revisit_share=1.0,
                       revisit_max_groups=2)  # fmt: skip
    first = await rg_env.ReasoningGymEnv.get_next_item(env)
    second = await rg_env.ReasoningGymEnv.get_next_item(env)
    env.revisits.record(rg_env.entry_key(first["entry"]), first, [1.1, 0.0, 0.1, 1.1])
    env.revisits.record(rg_env.entry_key(second["entry"]), second, [0.0, 0.0, 0.0, 0.0])
    assert await rg_env.ReasoningGymEnv.get_next_item(env) is first  # it taught: again
    fresh = await rg_env.ReasoningGymEnv.get_next_item(env)  # nothing waits: a new problem
    assert fresh["entry"] not in (first["entry"], second["entry"])
    env.revisits.record(rg_env.entry_key(first["entry"]), first, [1.1, 0.0, 0.1, 1.1])
    assert len(env.revisits) == 0, "two groups were its limit"
    with pytest.raises(ValueError, match="revisit_share"):
        rg_env.ReasoningGymConfig(revisit_share=1.5)
