"""Atropos 0.4's reward registry: names, configs and scores as atroposlib 0.4.0 gave them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from atroposlib.envs.reward_fns import CombinedReward, RewardFunction, registry
from atroposlib.errors import ConfigError

GOLDEN = json.loads((Path(__file__).parent / "data" / "atropos_040_reward_scores.json").read_text())


def _scores(key: str) -> list[float]:
    texts = GOLDEN["texts"]
    if key == "cfg":
        return registry.create({"type": "format", "params": {"preferred_tags": ["answer"]},
                                "weight": 2.0})(texts)  # fmt: skip
    if key == "combined_sum":
        return CombinedReward(["format_reward", "reasoning_steps"], normalization="sum")(texts)
    if key == "combined_minmax":
        return CombinedReward(["format", "repetition_penalty"], normalization="minmax")(texts)
    name, kwargs = key.split(":", 1)
    return registry.create(name)(texts, **json.loads(kwargs))


@pytest.mark.parametrize("key", sorted(GOLDEN["scores"]))
def test_scores_equal_atropos_040(key: str) -> None:
    assert _scores(key) == pytest.approx(GOLDEN["scores"][key], abs=1e-9)


def test_a_registered_class_is_created_by_name_with_config_params() -> None:
    @registry.register
    class ShoutReward(RewardFunction):
        def __init__(self, bonus: float = 0.0, **kwargs: object) -> None:
            super().__init__(**kwargs)  # type: ignore[arg-type]
            self.bonus = bonus

        def compute(self, completions: list[object], **kwargs: object) -> list[float]:
            return [1.0 + self.bonus if self.get_content(c).isupper() else 0.0 for c in completions]

    assert registry.get("shout") is ShoutReward
    reward = registry.create({"type": "shout", "params": {"bonus": 0.5}, "weight": 2.0})
    assert reward(["HI", "hi"]) == [3.0, 0.0]
    assert "shout" in registry.list_registered()


def test_function_rewards_are_wrapped_and_unknown_names_say_what_exists() -> None:
    wrapped = registry.create("gsm8k_reward")
    assert wrapped(["#### 4", "#### 5"], answer=["#### 4"] * 2) == [1.0, 0.0]
    with pytest.raises(ConfigError, match="accuracy"):
        registry.create("no_such_reward")


def test_a_reward_that_raises_scores_zero_instead_of_stopping_the_rollout() -> None:
    class Broken(RewardFunction):
        def compute(self, completions: list[object], **kwargs: object) -> list[float]:
            raise RuntimeError("bug in user reward")

    assert Broken()(["a", "b"]) == [0.0, 0.0]


def test_load_required_functions_reads_dataset_env_configs() -> None:
    class Config:
        reward_funcs = ["accuracy_reward", "format_reward"]
        reward_functions = [{"type": "reasoning_steps", "params": {}}]

    assert registry.load_required_functions(Config()) == {
        "accuracy_reward", "format_reward", "reasoning_steps"}  # fmt: skip
