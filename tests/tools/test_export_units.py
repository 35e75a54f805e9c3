"""The exporters' pure core: selection, pairing, text split, broker source (fake client)."""

from __future__ import annotations

import doctest
import re
from collections import Counter
from typing import Any

import pytest

from atroposlib.export import selection, text
from atroposlib.export.selection import ScoreFilters, pair_best_worst, select_top_n
from atroposlib.export.sources import BrokerRegistration, BrokerSource, SourceBatch
from atroposlib.wire.broker import TrainerRegistration


@pytest.mark.parametrize("module", [selection, text])
def test_doctests(module: Any) -> None:
    failures, tried = doctest.testmod(module)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize(
    ("scores", "filters", "top_n", "kept", "reasons"),
    [
        ([0.0, 1.0, 0.5], ScoreFilters(), 3, [1, 2], {"score_not_positive": 1}),
        ([1.0, 1.0, 1.0], ScoreFilters(), 2, [0, 1], {"beyond_top_n": 1}),
        ([-1.0, -2.0], ScoreFilters(allow_negative_scores=True), 5, [0, 1], {}),
        ([1.0, 0.6, 0.4], ScoreFilters(minimum_score_diff=0.2), 3, [0, 1], {"below_score_gap": 1}),
        ([1.0, 1.0], ScoreFilters(minimum_score_diff=0.1), 3, [], {"below_score_gap": 2}),
        ([], ScoreFilters(), 3, [], {}),
    ],
)
def test_select_top_n(
    scores: list[float],
    filters: ScoreFilters,
    top_n: int,
    kept: list[int],
    reasons: dict[str, int],
) -> None:
    skipped: Counter[str] = Counter()
    assert select_top_n(scores, [True] * len(scores), filters, top_n, skipped) == kept
    assert dict(skipped) == reasons


def test_select_top_n_leaves_out_unusable_sequences_uncounted() -> None:
    skipped: Counter[str] = Counter()
    assert select_top_n([1.0, 0.9], [False, True], ScoreFilters(), 3, skipped) == [1]
    assert not skipped


@pytest.mark.parametrize(
    ("scores", "usable", "filters", "n_pairs", "pairs"),
    [
        ([1.0, 0.0, 0.8, 0.1], None, ScoreFilters(minimum_score_diff=0.5), 3, [(0, 1), (2, 3)]),
        ([1.0, 0.0, 0.8, 0.1], None, ScoreFilters(minimum_score_diff=0.75), 3, [(0, 1)]),
        ([1.0, 0.0, 0.8, 0.1], None, ScoreFilters(), 1, [(0, 1)]),
        ([0.5, 0.5, 0.5], None, ScoreFilters(), 3, []),
        ([0.0, -1.0], None, ScoreFilters(), 3, []),
        ([0.0, -1.0], None, ScoreFilters(allow_negative_scores=True), 3, [(0, 1)]),
        ([1.0, 0.0, 0.5], [True, False, True], ScoreFilters(minimum_score_diff=0.5), 3, [(0, 2)]),
        ([1.0, 1.0, 0.0, 0.0], None, ScoreFilters(), 3, [(0, 2), (1, 3)]),
    ],
)
def test_pair_best_worst(
    scores: list[float],
    usable: list[bool] | None,
    filters: ScoreFilters,
    n_pairs: int,
    pairs: list[tuple[int, int]],
) -> None:
    flags = usable if usable is not None else [True] * len(scores)
    assert pair_best_worst(scores, flags, filters, n_pairs, Counter()) == pairs


class _Decoder:
    def decode(self, token_ids: list[int], **kwargs: Any) -> str:
        return "".join(chr(ord("a") + token) for token in token_ids)


def test_split_follows_the_masks_not_the_strings() -> None:
    split = text.split_prompt_completion(_Decoder(), [0, 1, 2, 3, 4], [-100, -100, 2, -100, 4])
    assert split == text.PromptCompletion(prompt="ab", completion="cde")
    assert text.split_prompt_completion(_Decoder(), [0, 1], [-100, -100]) is None


class _FakeTrainer:
    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches
        self.registered: list[TrainerRegistration] = []
        self.acked: list[int] = []

    def register(self, registration: TrainerRegistration) -> int:
        self.registered.append(registration)
        return 1

    def get_batch(self) -> Any:
        return self.batches.pop(0) if self.batches else None

    def ack(self, step: int) -> None:
        self.acked.append(step)


class _Batch:
    def __init__(self, step: int, groups: list[dict[str, Any]]) -> None:
        self.step, self.groups = step, groups


def test_broker_source_registers_acks_after_write_and_stops_when_idle() -> None:
    import numpy as np

    group = {"tokens": [np.array([1, 2], dtype=np.int32)], "scores": [1.0]}
    client = _FakeTrainer([None, _Batch(1, [group]), None, None])
    now = [0.0]
    source = BrokerSource(
        client,
        BrokerRegistration(batch_size=4, max_token_len=64, name="t", num_steps=10),
        idle_timeout=2.0,
        clock=lambda: now[0],
        sleep=lambda seconds: now.__setitem__(0, now[0] + seconds),
    )
    seen: list[SourceBatch] = []
    for batch in source.batches():
        assert client.acked == []
        seen.append(batch)
        source.written(batch)
    assert [batch.groups for batch in seen] == [[{"tokens": [[1, 2]], "scores": [1.0]}]]
    assert client.acked == [1]
    assert source.timed_out
    (registration,) = client.registered
    assert registration.acknowledges and registration.batch_size == 4


def test_broker_source_resets_only_when_told() -> None:
    resets: list[bool] = []
    source = BrokerSource(
        _FakeTrainer([]),
        BrokerRegistration(batch_size=4, max_token_len=64, name="t", num_steps=1),
        idle_timeout=0.5,
        sleep=lambda _: None,
    )
    assert list(source.batches()) == []
    assert resets == []
    told = BrokerSource(
        _FakeTrainer([]),
        BrokerRegistration(batch_size=4, max_token_len=64, name="t", num_steps=1),
        idle_timeout=0.5,
        sleep=lambda _: None,
        reset_first=lambda: resets.append(True),
    )
    assert list(told.batches()) == []
    assert resets == [True]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"tokens": [[1, 2]], "masks": [[1]], "scores": [1.0]}', "masks[0] has 1 values"),
        ('{"tokens": [[1]], "masks": [[1]], "scores": [1.0, 0.0]}', "tokens has 1 sequences"),
        ('{"tokens": [[1]], "masks": [[1]], "scores": [1.0], "finish_reasons": ["eos"]}',
         "finish_reasons.0"),
        ("not json", "not JSON"),
    ],
)  # fmt: skip
def test_a_bad_dump_line_names_the_file_line_and_field(
    tmp_path: Any, line: str, expected: str
) -> None:
    from atroposlib.export.groups import GroupFileError, read_group_files

    dump = tmp_path / "groups.jsonl"
    dump.write_text('{"tokens": [[1]], "masks": [[1]], "scores": [1.0]}\n' + line + "\n")
    with pytest.raises(GroupFileError, match=rf"groups\.jsonl:2: .*{re.escape(expected)}"):
        list(read_group_files([str(dump)]))
