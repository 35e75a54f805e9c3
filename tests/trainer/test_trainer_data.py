"""Batch -> samples (advantages, overrides) and micro-batch planning."""

from __future__ import annotations

import numpy as np
import pytest
from trainer_helpers import make_group

from example_trainer.config import LossConfig
from example_trainer.data import (
    batch_to_samples,
    batch_totals,
    collate,
    micro_batch_costs,
    padded_tokens,
    plan_microbatches,
    shard_plan,
)


def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def test_advantages_from_scores_are_broadcast_to_every_token() -> None:
    group = make_group(rng(), [0.0, 1.0])
    samples, _, stats = batch_to_samples([group], LossConfig(advantage_std="none"))
    assert [float(s.advantages[0]) for s in samples] == [-0.5, 0.5]
    assert all(np.all(s.advantages == s.advantages[0]) for s in samples)
    assert stats.rewards_by_env == {"0": 0.5}
    assert stats.advantage["max"] == pytest.approx(0.5)


def test_advantages_given_by_the_env_are_used_per_token() -> None:
    group = make_group(rng(), [0.0, 0.0])
    given = [np.linspace(-1, 1, len(t)).astype(np.float32) for t in group["tokens"]]
    group["advantages"] = given
    samples, _, _ = batch_to_samples([group], LossConfig())
    for sample, adv in zip(samples, given, strict=True):
        np.testing.assert_array_equal(sample.advantages, adv)
        assert sample.weight == 1.0  # equal scores, but the env chose the advantages


def test_set_advantage_to_zero_override() -> None:
    group = make_group(rng(), [0.0, 1.0], overrides=[{}, {"set_advantage_to_zero": True}])
    samples, _, _ = batch_to_samples([group], LossConfig(advantage_std="none"))
    assert samples[0].advantages[0] == -0.5 and not samples[1].advantages.any()


def test_temperature_sequence_beats_group_beats_generation_params() -> None:
    group = make_group(
        rng(),
        [0.0, 1.0, 0.5],
        overrides=[{"temperature": 0.5}, {}, {}],
        group_overrides={"temperature": 0.8},
        generation_params={"temperature": 1.3},
    )
    samples, _, _ = batch_to_samples([group], LossConfig())
    assert [s.temperature for s in samples] == [0.5, 0.8, 0.8]
    plain = make_group(rng(), [0.0, 1.0], generation_params={"temperature": 1.3})
    assert [s.temperature for s in batch_to_samples([plain], LossConfig())[0]] == [1.3, 1.3]


def test_sft_rows_are_flagged_and_never_masked_as_zero_variance() -> None:
    sft = make_group(rng(), [1.0], group_overrides={"sft": True})
    samples, _, stats = batch_to_samples([sft], LossConfig())
    assert samples[0].sft and samples[0].weight == 1.0 and stats.sft_rows == 1
    assert stats.zero_variance_groups == 0


def test_zero_variance_groups_are_masked_unless_disabled() -> None:
    flat = make_group(rng(), [1.0, 1.0, 1.0])
    samples, _, stats = batch_to_samples([flat], LossConfig())
    assert [s.weight for s in samples] == [0.0] * 3 and stats.zero_variance_groups == 1
    assert batch_totals(samples).tokens == 0
    kept, _, _ = batch_to_samples([flat], LossConfig(mask_zero_variance_groups=False))
    assert [s.weight for s in kept] == [1.0] * 3


def test_truncated_completions_masked_when_asked() -> None:
    overrides = [{"truncated": True}, {}, {}, {}]
    group = make_group(rng(), [0.0, 1.0, 0.5, 0.2], overrides=overrides)
    group["finish_reasons"] = ["stop", "length", "stop", "abort"]
    samples, _, stats = batch_to_samples([group], LossConfig(mask_truncated=True))
    assert [s.weight for s in samples] == [0.0, 0.0, 1.0, 1.0] and stats.truncated_masked == 2
    unmasked, _, _ = batch_to_samples([group], LossConfig())
    assert [s.weight for s in unmasked] == [1.0] * 4


def test_a_group_with_invalid_metadata_is_skipped_and_counted() -> None:
    good = make_group(rng(), [0.0, 1.0])
    bad = make_group(rng(), [0.0, 1.0], overrides=[{"sft": "yes"}, {}])
    samples, _, stats = batch_to_samples([bad, good], LossConfig())
    assert len(samples) == 2 and stats.invalid_groups == 1


def test_spiral_roles_from_sequence_and_group_overrides() -> None:
    cfg = LossConfig(role_baseline=True, role_baseline_decay=0.5)
    game = make_group(
        rng(), [1.0, 0.0], overrides=[{"role": "p0"}, {"role": "p1"}], env_id=3
    )  # zero-sum game: one win, one loss
    solo = make_group(rng(), [1.0], group_overrides={"role": "p0"}, env_id=3)
    samples, baselines, _ = batch_to_samples([game, solo], cfg)
    assert [float(s.advantages[0]) for s in samples] == pytest.approx([0.5, 0.0, 0.25])
    assert baselines == pytest.approx({(3, "p0"): 0.75, (3, "p1"): 0.0})
    again, _, _ = batch_to_samples([solo], cfg, baselines)  # state carries across batches
    assert float(again[0].advantages[0]) == pytest.approx(1.0 - 0.875)


def test_collate_aligns_next_token_targets_with_masks() -> None:
    group = make_group(rng(), [0.0, 1.0], prompt_len=3, completion_lens=[2, 4])
    samples, _, _ = batch_to_samples([group], LossConfig(advantage_std="none"))
    mb = collate(samples)
    assert mb.input_ids.shape == (2, 7) and mb.targets.shape == (2, 6)
    assert mb.targets[1].tolist() == group["tokens"][1][1:].tolist()
    # prompt of 3 -> positions 0,1 predict prompt tokens (masked), 2.. predict completion
    assert mb.mask.tolist() == [[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    assert mb.attention_mask.sum(1).tolist() == [5, 7]
    assert mb.advantages[0, 2].item() == -0.5 and mb.has_inference.all()
    assert batch_totals(samples).tokens == 6


LENGTHS = [100, 12, 90, 15, 50, 14, 95, 11, 48, 13, 52, 16]


def test_plan_respects_the_budget_and_covers_every_row() -> None:
    plan = plan_microbatches(LENGTHS, token_budget=200)
    assert sorted(i for mb in plan for i in mb) == list(range(len(LENGTHS)))
    assert all(len(mb) * max(LENGTHS[i] for i in mb) <= 200 for mb in plan)


def test_bucketing_pads_less_than_padding_to_the_longest() -> None:
    bucketed = padded_tokens(plan_microbatches(LENGTHS, 200), LENGTHS)
    arrival = padded_tokens(plan_microbatches(LENGTHS, 200, bucket=False), LENGTHS)
    naive = len(LENGTHS) * max(LENGTHS)  # every row padded to the longest of the batch
    assert sum(LENGTHS) <= bucketed < arrival < naive
    assert bucketed < 0.7 * naive


def test_oversized_row_gets_its_own_micro_batch() -> None:
    assert plan_microbatches([300, 10, 10], token_budget=100) == [[0], [1, 2]]


def test_shards_partition_the_plan_across_ranks() -> None:
    plan = plan_microbatches(LENGTHS, 200)
    costs = micro_batch_costs(plan, LENGTHS)
    shards = [shard_plan(plan, costs, 3, r) for r in range(3)]
    assert sorted(tuple(mb) for shard in shards for mb in shard) == sorted(map(tuple, plan))
    assert all(shards)
