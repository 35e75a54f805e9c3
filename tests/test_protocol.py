"""The wire contract keeps Atropos's field names and rejects what cannot work."""

import pytest
from pydantic import ValidationError

from atroposlib.group import SCORED_DATA_FIELDS
from atroposlib.wire.broker import EnvRegistration, ScoredData, TrainerRegistration

ATROPOS_GROUP_FIELDS = {
    "tokens",
    "masks",
    "scores",
    "advantages",
    "ref_logprobs",
    "messages",
    "generation_params",
    "inference_logprobs",
    "overrides",
    "group_overrides",
    "images",
    "env_id",
    "distill_token_ids",
    "distill_logprobs",
}


def test_group_keeps_every_atropos_field_and_adds_only_optional_ones() -> None:
    assert ATROPOS_GROUP_FIELDS <= set(SCORED_DATA_FIELDS)
    for name in set(SCORED_DATA_FIELDS) - ATROPOS_GROUP_FIELDS:
        assert not ScoredData.model_fields[name].is_required(), name


def test_group_messages_keep_extra_keys() -> None:
    group = ScoredData(
        tokens=[[1, 2]],
        masks=[[-100, 2]],
        scores=[1.0],
        messages=[[{"role": "user", "content": "hi", "tool_call_id": "x"}]],
    )
    assert group.model_dump()["messages"][0][0]["tool_call_id"] == "x"


def test_trainer_registration_requires_every_atropos_field() -> None:
    with pytest.raises(ValidationError) as err:
        TrainerRegistration.model_validate({"batch_size": 8})
    missing = {e["loc"][0] for e in err.value.errors() if e["type"] == "missing"}
    assert {"wandb_group", "max_token_len", "checkpoint_dir", "num_steps"} <= missing


@pytest.mark.parametrize("weight", [0.0, -1.0, float("nan"), float("inf")])
def test_env_weight_must_be_positive_and_finite(weight: float) -> None:
    with pytest.raises(ValidationError):
        EnvRegistration(max_token_length=10, desired_name="e", weight=weight, group_size=4)
