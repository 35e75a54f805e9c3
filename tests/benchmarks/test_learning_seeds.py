"""Issue 46's independent seeds: each run seed draws its own training stream, validation set
and test set (``StreamSeeds``), pairwise disjoint; the env's own defaults (the demo's held-out
set) do not move; leg counting's problems are keyed by their animals in any order."""

from __future__ import annotations

import pytest
import yaml

from benchmarks.learning_systems import (
    REPO,
    TASKS,
    StreamSeeds,
    Task,
    load_env_module,
    stream_seed,
)


@pytest.fixture(scope="module")
def three_sums() -> list[Task]:
    return [Task.load(TASKS["three_sums"], seed) for seed in (0, 1)]


def keys(task: Task, entries: list[dict]) -> set[str]:
    return {task.key(e) for e in entries}


def test_stream_seeds_are_stable_and_far_apart() -> None:
    seeds = [s for run in range(10) for s in vars(StreamSeeds.of(run)).values()]
    assert StreamSeeds.of(3).test == stream_seed(3, "test") == StreamSeeds.of(3).test
    gaps = [abs(a - b) for i, a in enumerate(seeds) for b in seeds[i + 1 :]]
    assert min(gaps) > 10**6  # a task draws ~50,000 items from Random(seed + i)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_train_validation_and_test_are_pairwise_disjoint(name: str) -> None:
    task = Task.load(TASKS[name], 1)
    train, validation, test = (keys(task, x) for x in (task.train, task.validation, task.test))
    assert len(validation) == len(task.validation) == 200 == len(test) == len(task.test)
    assert not train & validation and not train & test and not validation & test
    assert not (validation | test) & task.module.example_keys(task.config)


def test_two_seeds_share_training_streams_and_test_sets_only_by_chance(
    three_sums: list[Task],
) -> None:
    first, second = three_sums
    assert len(keys(first, first.test) & keys(second, second.test)) <= 8  # chance: ~2
    assert first.train[:50] != second.train[:50]  # not one stream shifted by an item
    shifted = [first.key(e) for e in first.train[1:51]]
    assert [second.key(e) for e in second.train[:50]] != shifted
    assert first.shared_test_problems([0, 1]) == {1: len(keys(first, first.test) &
                                                         keys(second, second.test))}  # fmt: skip


def test_the_env_flags_give_the_same_sets_the_benchmark_grades(three_sums: list[Task]) -> None:
    task = three_sums[1]
    module = task.module
    for split in ("test", "validation"):
        flags = task.env_flags(split)
        settings = {**task.config.model_dump(), "train_seed": None, "held_out_seed": None}
        pairs = zip(flags[::2], flags[1::2], strict=True)
        settings.update({flag[len("--env.") :]: int(value) for flag, value in pairs})
        problems = module.build_problems(module.ReasoningGymConfig(**settings))
        (entries,) = problems.test.values()
        assert [task.key(e) for e in entries] == [task.key(e) for e in task.problems(split)]
        assert [task.key(e) for e in next(iter(problems.train.values()))[:20]] == [
            task.key(e) for e in task.train[:20]
        ]


def test_the_envs_defaults_are_todays_data_seed_and_seed_plus_one() -> None:
    module = load_env_module()
    settings = yaml.safe_load(TASKS["sums"].read_text())["env"]
    plain = module.build_problems(module.ReasoningGymConfig(**settings, seed=4))
    explicit = module.build_problems(
        module.ReasoningGymConfig(**settings, seed=9, train_seed=4, held_out_seed=5)
    )
    assert plain.test == explicit.test and plain.train == explicit.train


def test_leg_counting_keys_the_animals_in_any_order() -> None:
    task = Task.load(REPO / "configs" / "local-cpu-legs-env.yaml", 1)
    entry = next(e for e in task.train if len(e["metadata"]["animals"]) == 2)
    (a, n), (b, m) = entry["metadata"]["animals"].items()
    swapped = {**entry, "metadata": {**entry["metadata"], "animals": {b: m, a: n}}}
    assert task.key(swapped) == task.key(entry)
    assert task.module.example_keys(task.config) == {
        "leg_counting:legs of 2 cat, 1 spider", "leg_counting:legs of 3 duck"}  # fmt: skip
    right = f"<answer>{entry['answer']}</answer>"
    assert task.grade(right, entry).strict and task.reward(right, entry) == pytest.approx(1.1)
