"""code_game, tictactoe and blackjack: game logic, role tags, rewards, ``process`` runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from envcat_testlib import TokenFake, load_env_module, process_groups, tokenizer_path

code_game = load_env_module("code_game")
tictactoe = load_env_module("tictactoe")
blackjack = load_env_module("blackjack")
FENCE = "```python\n{}\n```"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_path())


def bare_env(module: Any, cls_name: str, server: TokenFake, **config: Any) -> Any:
    env_cls = getattr(module, cls_name)
    env = object.__new__(env_cls)
    env.config = env_cls.env_config_cls(**config)
    env.server = server
    env._tokenizer = server.tokenizer
    return env


def assert_token_exact(trajectory: Any, server: TokenFake) -> None:
    """Each request continued from the trajectory's own ids; trained ids are the sampled ones."""
    sampled = [(p, o) for p, o in server.sampled if trajectory.tokens[: len(p)] == p]
    assert sampled, "no request sent a prefix of this trajectory"
    for prompt, output in sampled:
        assert trajectory.tokens[len(prompt) : len(prompt) + len(output)] == output
    assert trajectory.sampled_ids == [t for _, output in sampled for t in output]


# ---- code_game ----


@pytest.mark.slow
def test_code_game_process_zero_sum_rewards_and_roles(scripted, tmp_path: Path) -> None:
    programs = [FENCE.format("print(6 * 7)"), FENCE.format("print(3 + 4)"),
                FENCE.format("def f(:"), FENCE.format("x = 1")]  # fmt: skip
    server = scripted([
        {"when": "print(6 * 7)", "replies": ["<answer>13</answer>"]},
        {"when": "print(3 + 4)", "replies": ["<answer>8</answer>", "<answer>7</answer>"]},
        {"when": "Another player", "replies": programs},
    ])  # fmt: skip
    groups = process_groups("code_game", server, tmp_path, "--env.group_size=4",
                            "--env.predictor_samples=2", steps=3)  # fmt: skip
    writer, first, second = groups
    assert writer["scores"] == [1.0, 0.0, -1.0, -1.0]
    assert [o["role"] for o in writer["overrides"]] == ["writer"] * 4
    predictions = {
        g["messages"][0][0]["content"].split("```python\n")[1][:12]: g for g in (first, second)
    }
    assert predictions["print(6 * 7)"]["scores"] == [-1.0, -1.0]
    assert predictions["print(3 + 4)"]["scores"] == [-1.0, 1.0]
    for group in (first, second):
        assert group["group_overrides"]["group_size"] == 2
        assert [o["role"] for o in group["overrides"]] == ["predictor"] * 2


# ---- tictactoe ----


def scripted_moves(x_moves: list[int], o_moves: list[int], tokenizer: Any) -> TokenFake:
    queues = {"X": list(x_moves), "O": list(o_moves)}

    def choose(messages: list[dict], _: int) -> str:
        users = [m for m in messages if m["role"] == "user"]
        role = "X" if "You are X" in users[-1]["content"] else "O"
        return f"<move>{queues[role].pop(0)}</move>"

    return TokenFake(choose, tokenizer)


@pytest.mark.parametrize(
    ("x_moves", "o_moves", "rewards"),
    [
        ([1, 2, 3], [5, 6], {"X": 1.0, "O": -1.0}),  # X completes the top row
        ([1, 9, 8], [5, 3, 7], {"X": -1.0, "O": 1.0}),  # O completes the 3-5-7 diagonal
        ([1, 3, 8, 4, 6], [2, 5, 7, 9], {"X": 0.0, "O": 0.0}),  # draw
        ([1, 1], [5], {"X": -1.0, "O": 0.0}),  # X replays an occupied cell: illegal
        ([1], [10], {"X": 0.0, "O": -1.0}),  # O names a cell that does not exist
    ],
)
async def test_tictactoe_game_outcomes(x_moves, o_moves, rewards, tokenizer) -> None:
    server = scripted_moves(x_moves, o_moves, tokenizer)
    env = bare_env(tictactoe, "TicTacToeEnv", server, group_size=2)
    result = await env.play(env.token_sampler())
    assert {role: score for role, (_, score) in result.items()} == rewards
    x_chat = result["X"][0].messages
    assert x_chat[0]["role"] == "system" and "you are X" in x_chat[0]["content"]
    assert x_chat[-1]["role"] == "assistant"
    for role in "XO":
        if result[role][0].turns:
            assert_token_exact(result[role][0], server)


def test_tictactoe_rejects_odd_group_size() -> None:
    with pytest.raises(ValueError, match="odd"):
        tictactoe.TicTacToeConfig(group_size=3)


@pytest.mark.slow
def test_tictactoe_process_tags_roles(scripted, tmp_path: Path) -> None:
    server = scripted([
        {"when": "You are X", "replies": ["<move>1</move>", "<move>2</move>", "<move>3</move>"]},
        {"when": "You are O", "replies": ["<move>5</move>", "<move>6</move>"]},
    ])  # fmt: skip
    (group,) = process_groups("tictactoe", server, tmp_path, "--env.group_size=2", steps=1)
    assert [o["role"] for o in group["overrides"]] == ["X", "O"]
    assert group["scores"] == [1.0, -1.0]
    x_roles = [m["role"] for m in group["messages"][0]]
    assert x_roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    trained = [t for t in group["masks"][0] if t != -100]
    assert 0 < len(trained) < len(group["tokens"][0])


# ---- blackjack ----


def blackjack_env(reply: str, tokenizer: Any, **config: Any) -> Any:
    env = bare_env(blackjack, "BlackjackEnv", TokenFake(lambda m, i: reply, tokenizer), **config)
    return env, env.token_sampler()


async def test_blackjack_episode_matches_gymnasium(tokenizer) -> None:
    for seed in range(6):
        env, sampler = blackjack_env("<action>stick</action>", tokenizer)
        trajectory, reward = await env.episode(sampler, seed)
        game = gym.make("Blackjack-v1", natural=True)
        game.reset(seed=seed)
        assert reward == game.step(0)[1]
        assert [m["role"] for m in trajectory.messages] == ["system", "user", "assistant"]
        assert_token_exact(trajectory, env.server)


async def test_blackjack_hitting_forever_busts_and_bad_replies_forfeit(tokenizer) -> None:
    env, sampler = blackjack_env("<action>hit</action>", tokenizer)
    trajectory, reward = await env.episode(sampler, 1)
    assert reward == -1.0 and trajectory.turns >= 1
    assert_token_exact(trajectory, env.server)
    bad, sampler = blackjack_env("I'd rather not", tokenizer, invalid_action_reward=-2.0)
    assert (await bad.episode(sampler, 1))[1] == -2.0


@pytest.mark.slow
def test_blackjack_process(scripted, tmp_path: Path) -> None:
    server = scripted([{"when": "", "replies": ["<action>stick</action>"]}])
    groups = process_groups("blackjack", server, tmp_path, "--env.group_size=3")
    for group in groups:
        assert len(set(group["scores"])) == 1  # same seed, same actions: same outcome
        assert group["scores"][0] in (-1.0, 0.0, 1.0, 1.5)
        assert "Your hand totals" in group["messages"][0][1]["content"]
    assert json.dumps(groups)  # serialisable as the broker receives it
