"""Tic-tac-toe self-play: the same model plays X and O, one request per move.

Each player's sequence is its own multi-turn trajectory in token ids (the board before each
of its moves, its sampled replies; each move's request continues from exactly those ids) and
carries ``overrides[i]["role"]`` = ``"X"`` or ``"O"`` for role-conditioned baselines.
Rewards: win +1, draw 0, loss -1; an illegal or unreadable move loses at once (-1) and the
opponent scores 0. A group is ``group_size // 2`` games, X and O of each.
"""

import asyncio
import re

from pydantic import Field, model_validator

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.rollouts import TokenSampler
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.trajectory import Trajectory
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
RULES = (
    "We play tic-tac-toe; you are {role}. Cells are numbered 1-9, left to right, top to bottom. "
    "Reply with your move as <move>N</move> for a free cell N."
)
_MOVE = re.compile(r"<move>\s*(\d)\s*</move>")


class TicTacToeConfig(BaseEnvConfig):
    max_completion_tokens: int = Field(default=64, ge=1, description="Tokens per move.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")

    @model_validator(mode="after")
    def even_group(self) -> "TicTacToeConfig":
        if self.group_size % 2:
            raise ValueError(f"group_size {self.group_size} is odd: each game gives 2 sequences")
        return self


def render(board: list[str]) -> str:
    """The board as three rows, free cells shown by their number.

    >>> print(render(["X", "", "", "", "O", "", "", "", ""]))
    X 2 3
    4 O 6
    7 8 9
    """
    cells = [mark or str(i + 1) for i, mark in enumerate(board)]
    return "\n".join(" ".join(cells[row * 3 : row * 3 + 3]) for row in range(3))


def parse_move(reply: str, board: list[str]) -> int | None:
    """The 0-based cell of the last ``<move>N</move>`` if that cell is free, else None.

    >>> board = ["X", "", "", "", "", "", "", "", ""]
    >>> parse_move("<move>5</move>", board), parse_move("<move>1</move>", board)
    (4, None)
    >>> parse_move("I take 5", board), parse_move("<move>0</move>", board)
    (None, None)
    """
    found = _MOVE.findall(reply)
    if not found or not 1 <= int(found[-1]) <= 9 or board[int(found[-1]) - 1]:
        return None
    return int(found[-1]) - 1


def winner(board: list[str]) -> str | None:
    """``"X"`` or ``"O"`` when a line is complete, ``"draw"`` when the board is full, else None.

    >>> winner(["X", "X", "X", "O", "O", "", "", "", ""]), winner(["X", "O"] * 4 + ["X"])
    ('X', 'X')
    >>> winner(list("XOXXOOOXX")), winner([""] * 9)
    ('draw', None)
    """
    for a, b, c in LINES:
        if board[a] and board[a] == board[b] == board[c]:
            return board[a]
    return "draw" if all(board) else None


class TicTacToeEnv(BaseEnv):
    name = "tictactoe"
    env_config_cls = TicTacToeConfig

    @classmethod
    def config_init(cls) -> tuple[TicTacToeConfig, list[APIServerConfig]]:
        config = TicTacToeConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=8,
            max_token_length=2048,
            total_steps=500,
            steps_per_eval=0,
        )
        return config, [
            APIServerConfig(
                model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
            )
        ]

    async def get_next_item(self) -> Item:
        return {}

    async def play(self, sampler: TokenSampler) -> dict[str, tuple[Trajectory, float]]:
        """One game; each role's trajectory and reward."""
        board = [""] * 9
        rules = {role: {"role": "system", "content": RULES.format(role=role)} for role in "XO"}
        sides = {role: sampler.start([rules[role]]) for role in "XO"}
        role = "X"
        while True:
            board_text = f"You are {role}. Board:\n{render(board)}\nYour move."
            turn = {"role": "user", "content": board_text}
            side = sides[role]
            side = (
                sampler.add_messages(side, [turn])
                if side.turns
                else sampler.start([rules[role], turn])
            )
            [sides[role]] = await sampler.sample(side)
            other = "O" if role == "X" else "X"
            cell = parse_move(sides[role].reply, board)
            if cell is None:
                return {role: (sides[role], -1.0), other: (sides[other], 0.0)}
            board[cell] = role
            result = winner(board)
            if result == "draw":
                return {r: (sides[r], 0.0) for r in "XO"}
            if result == role:
                return {role: (sides[role], 1.0), other: (sides[other], -1.0)}
            role = other

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        sampler = self.token_sampler()
        games = await asyncio.gather(
            *(self.play(sampler) for _ in range(self.config.group_size // 2))
        )
        sides = [(role, *game[role]) for game in games for role in "XO"]
        group = sampler.group(
            [trajectory for _, trajectory, _ in sides],
            [score for _, _, score in sides],
            overrides=[{"role": role} for role, _, _ in sides],
        )
        return group, []


if __name__ == "__main__":
    TicTacToeEnv.cli()
