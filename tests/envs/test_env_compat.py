"""The names Atropos 0.4 environments import resolve at the same paths."""

from __future__ import annotations

import importlib

import pytest

ATROPOS_IMPORTS = {
    "atroposlib.envs.base": [
        "BaseEnv", "BaseEnvConfig", "ScoredDataGroup", "ScoredDataItem", "EvalHandlingEnum",
        "APIServerConfig", "ServerBaseline", "Item",
    ],
    "atroposlib.envs.server_handling.server_baseline": [
        "APIServerConfig", "ServerBaseline", "APIServer",
    ],
    "atroposlib.envs.server_handling.server_manager": [
        "APIServerConfig", "ServerBaseline", "ServerManagerConfig", "ServerManager", "APIServer",
    ],
    "atroposlib.envs.server_handling.openai_server": ["OpenAIServer"],
    "atroposlib.envs.server_handling.sglang_server": ["SGLangServer"],
    "atroposlib.envs.server_handling.vllm_server": ["VLLMServer"],
    "atroposlib.envs.server_handling.managed": ["ManagedServer", "SequenceNode"],
    "atroposlib.type_definitions": [
        "Item", "Message", "UUID", "number", "AgentStep", "GameHistory", "EvaluationSample",
    ],
    "atroposlib.utils.tokenize_for_trainer": ["tokenize_for_trainer"],
    "atroposlib.utils.advantages": [
        "allclose_to_first", "compute_stats", "compute_discounted_returns",
        "compute_grpo_process_supervision_advantages",
    ],
}  # fmt: skip


@pytest.mark.parametrize("module", sorted(ATROPOS_IMPORTS))
def test_atropos_import_paths(module: str) -> None:
    loaded = importlib.import_module(module)
    missing = [name for name in ATROPOS_IMPORTS[module] if not hasattr(loaded, name)]
    assert not missing, f"{module} lacks {missing}"


def test_base_env_keeps_the_atropos_attributes_and_hooks() -> None:
    from atroposlib.envs.base import BaseEnv

    for hook in (
        "setup", "get_next_item", "collect_trajectory", "collect_trajectories",
        "postprocess_histories", "evaluate", "wandb_log", "config_init", "cleanup", "cli",
        "save_checkpoint", "load_checkpoint", "evaluate_log", "add_rollouts_for_wandb",
        "create_rollout_table", "handle_send_to_api", "derived_batch_size",
    ):  # fmt: skip
        assert callable(getattr(BaseEnv, hook)), hook
    assert BaseEnv.name is None and BaseEnv.env_config_cls.__name__ == "BaseEnvConfig"


@pytest.mark.model
def test_env_tokenizer_chat_template_returns_ids_as_atropos_envs_expect(
    test_model_path: object,
) -> None:
    from atroposlib.envs.base import BaseEnv, BaseEnvConfig

    class Probe(BaseEnv):
        async def get_next_item(self) -> None:
            return None

    env = Probe(BaseEnvConfig(tokenizer_name=str(test_model_path), use_wandb=False), [],
                testing=True)  # fmt: skip
    chat = [{"role": "user", "content": "hi"}]
    ids = env.tokenizer.apply_chat_template(chat)  # gym_taxi takes len() of this
    assert isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)
    assert list(env.tokenizer.apply_chat_template(chat, return_dict=True)["input_ids"]) == ids
    assert isinstance(env.tokenizer.apply_chat_template(chat, tokenize=False), str)
