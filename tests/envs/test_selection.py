"""SignalSelector: kinds of problems drawn by the share of their recent groups that taught."""

from __future__ import annotations

import random

import pytest

from atroposlib.envs.selection import RevisitPool, SignalSelector


def selector(**settings: float) -> SignalSelector:
    return SignalSelector(random.Random(0), **settings)  # type: ignore[arg-type]


def test_an_unseen_kind_and_one_seen_too_few_times_are_always_admitted() -> None:
    chosen = selector(min_groups=4)
    for _ in range(3):
        chosen.record("solved", [1.0, 1.0, 1.0, 1.0])
    chosen.record("mixed", [1.0, 0.0])
    assert chosen.admission("never seen") == 1.0
    assert chosen.signal_share("solved") is None and chosen.admission("solved") == 1.0


def test_kinds_are_admitted_in_proportion_to_their_signal_never_below_the_floor() -> None:
    chosen = selector(window=10, min_groups=10, floor=0.1)
    for i in range(10):
        chosen.record("always solved", [1.1, 1.1, 1.1, 1.1])
        chosen.record("mixed", [1.1, 0.0, 1.1, 0.1])
        chosen.record("sometimes", [0.0, 0.0, 0.0, 1.0] if i % 2 else [0.0] * 4)
    assert chosen.signal_share("mixed") == 1.0 and chosen.signal_share("sometimes") == 0.5
    assert chosen.admission("mixed") == 1.0
    assert chosen.admission("sometimes") == pytest.approx(0.5)
    assert chosen.admission("always solved") == pytest.approx(0.1)
    draws = [chosen.admit("always solved") for _ in range(2000)]
    assert 0.07 < sum(draws) / len(draws) < 0.13
    assert chosen.skipped + chosen.admitted == 2000


def test_a_kind_that_starts_teaching_again_is_noticed_within_its_window() -> None:
    chosen = selector(window=8, min_groups=8, floor=0.2)
    for _ in range(8):
        chosen.record("a", [0.0, 1.0])
        chosen.record("b", [1.0, 1.0])
    assert chosen.admission("b") == pytest.approx(0.2)
    for _ in range(8):  # the model now sometimes fails b
        chosen.record("b", [1.0, 0.0])
    assert chosen.admission("b") == 1.0


def test_when_no_kind_teaches_nothing_is_skipped() -> None:
    chosen = selector(window=4, min_groups=4)
    for _ in range(4):
        chosen.record("a", [0.0, 0.0])
        chosen.record("b", [1.0, 1.0])
    assert chosen.admission("a") == chosen.admission("b") == 1.0


def test_the_summary_names_each_kind_with_its_figures() -> None:
    chosen = selector(window=2, min_groups=1)
    chosen.record("k", [1.0, 0.0])
    chosen.record("k", [1.0, 1.0])
    assert chosen.summary() == {
        "k": {"groups": 2, "signal_share": 0.5, "mean_score": 0.75, "admission": 1.0}
    }


@pytest.mark.parametrize(
    ("settings", "named"),
    [({"window": 0}, "min_groups <= window"), ({"window": 4, "min_groups": 5}, "min_groups"),
     ({"floor": 0.0}, "floor 0.0"), ({"floor": 1.5}, "(0, 1]")],
)  # fmt: skip
def test_settings_that_cannot_work_are_refused_with_the_fix(
    settings: dict[str, float], named: str
) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace("]", r"\]")):
        selector(**settings)


def test_a_problem_that_taught_comes_back_the_longest_waiting_first() -> None:
    pool = RevisitPool(random.Random(0), share=1.0)
    pool.record("a", {"q": "a"}, [1.0, 0.0])
    pool.record("b", {"q": "b"}, [1.0, 1.0])  # taught nothing: not kept
    pool.record("c", {"q": "c"}, [0.0, 0.1])
    assert len(pool) == 2
    assert pool.draw() == {"q": "a"} and pool.draw() == {"q": "c"}
    assert pool.draw() is None and pool.revisits == 2


def test_a_problem_leaves_once_it_stops_teaching_or_has_had_its_groups() -> None:
    pool = RevisitPool(random.Random(0), share=1.0, max_groups=3)
    pool.record("a", "item a", [1.0, 0.0])  # group 1
    assert pool.draw() == "item a"
    pool.record("a", "item a", [1.0, 0.0])  # group 2: still teaching
    assert pool.draw() == "item a"
    pool.record("a", "item a", [0.0, 1.0])  # group 3 of 3: done
    assert len(pool) == 0
    pool.record("b", "item b", [1.0, 0.0])
    assert pool.draw() == "item b"
    pool.record("b", "item b", [1.0, 1.0])  # learned: leaves
    assert len(pool) == 0 and pool.draw() is None


def test_the_share_of_draws_that_revisit() -> None:
    pool = RevisitPool(random.Random(3), share=0.25)
    drawn = 0
    for i in range(4000):
        pool.record(i, i, [0.0, 1.0])
        drawn += pool.draw() is not None
    assert 0.22 < drawn / 4000 < 0.28
    assert RevisitPool(random.Random(0), share=0.0).draw() is None


@pytest.mark.parametrize(
    ("settings", "named"),
    [({"share": 1.5}, "in \\[0, 1\\]"), ({"share": 0.5, "max_groups": 0}, "at least")],
)
def test_revisit_settings_that_cannot_work_are_refused(
    settings: dict[str, float], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        RevisitPool(random.Random(0), **settings)  # type: ignore[arg-type]
