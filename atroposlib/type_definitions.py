"""Types environment authors import (kept at the Atropos 0.4 path and names)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from openai.types.chat import ChatCompletionContentPartParam

Item = Any
"""Whatever ``get_next_item`` hands to ``collect_trajectories``: a dataset row, a seed, ..."""

UUID = str
number = int | float
Content = str | list[ChatCompletionContentPartParam]
Role = Literal["system", "user", "assistant", "tool", "agent"]


class Message(TypedDict):
    """One chat message; ``reward`` is optional and only some environments set it."""

    role: Role | str
    content: Content | Any
    reward: NotRequired[float | None]


class AgentStep(TypedDict, total=False):
    """One step of one agent in a multi-agent episode."""

    step: int
    messages: list[Message]
    reward: float


AgentHistory = dict[str, list[AgentStep]]
"""Agent id (``"Player 1"``) to that agent's steps."""


class Observation(TypedDict):
    raw: dict[str, Any]
    rendered: Content


class GameStep(TypedDict):
    step: int
    agent_id: str
    observation: Observation
    action: str
    reward: float | dict[str, float]
    done: bool
    info: dict[str, Any]


GameHistory = list[GameStep]


class EvaluationConfigGeneral(TypedDict):
    total_evaluation_time_seconds: str
    model_name: str | None
    generation_parameters: dict[str, Any]


class EvaluationResults(TypedDict):
    all: dict[str, float]


class EvaluationMetrics(TypedDict):
    """The shape of ``metrics.json`` written by ``evaluate_log``."""

    config_general: EvaluationConfigGeneral
    results: EvaluationResults


class EvaluationSample(TypedDict, total=False):
    messages: list[dict[str, str]] | None
    question: str | None
    gold_answer: str | None
    gold_parsed: str | None
    model_parsed: str | None
    score: int | None
    correct: bool | None
    finish_reason: str | None
    response_after_think: str | None


__all__ = [
    "UUID",
    "AgentHistory",
    "AgentStep",
    "Content",
    "EvaluationConfigGeneral",
    "EvaluationMetrics",
    "EvaluationResults",
    "EvaluationSample",
    "GameHistory",
    "GameStep",
    "Item",
    "Message",
    "Observation",
    "Role",
    "number",
]
