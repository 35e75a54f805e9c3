"""An agent written with the plain ``openai`` client, trained through the managed-server proxy.

"A class buys 3 notebooks and 5 pens. How many dollars is that in total?" The agent loop is
ordinary OpenAI code (``run_agent``): it sends the chat with two tools, runs the tool calls the
model makes (``price`` looks an item up, ``calculate`` does arithmetic; both in process, no
model text is ever ``eval``-ed) and sends the results back, for up to ``max_turns`` replies.
It only knows a base URL and a key: each episode gets a session of a proxy this env serves on a
loopback port over its own inference servers, which records every reply token-in/token-out (the
agent's key is the session's token: it opens that session and nothing else). The
episode's trajectory is the session's recorded node: the exact ids the engine saw and sampled,
each turn continuing the last. Score: 1.0 for the right total in ``<answer>``, plus
``tool_weight`` when at least one tool call ran without error.
"""

import ast
import asyncio
import logging
import operator
import random

import openai
from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.hermes import tool_calls_as_text
from atroposlib.envs.reward_fns.answers import extract_answer_tag, normalize_number
from atroposlib.envs.rollouts import trajectory_group
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.trajectory import Trajectory
from atroposlib.errors import ModelOutputError
from atroposlib.group import ScoredData
from atroposlib.proxy import LocalProxy, node_trajectory, serve_proxy
from atroposlib.type_definitions import Item
from atroposlib.utils.bounded_json import loads_model_output

logger = logging.getLogger(__name__)

PRICES = {"notebook": 3, "pen": 2, "backpack": 24, "stapler": 7, "ruler": 4, "marker": 5,
          "folder": 6, "eraser": 1, "glue stick": 3, "calendar": 9}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {
        "name": "price", "description": "The price in dollars of one school supply item.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}}}},
    {"type": "function", "function": {
        "name": "calculate", "description": "Evaluate arithmetic, e.g. 3*4+2*5.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}},
]  # fmt: skip
SYSTEM_PROMPT = ("Look up prices with the price tool and do arithmetic with the calculate tool. "
                 "When you know the total, reply with it inside <answer></answer>.")  # fmt: skip
NUDGE = "Use the tools, or give the total inside <answer></answer>."
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv}  # fmt: skip


class OpenAIAgentConfig(BaseEnvConfig):
    max_completion_tokens: int = Field(default=96, ge=1, description="Tokens per model reply.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature.")
    max_turns: int = Field(default=4, ge=1, description="Model replies per episode at most.")
    tool_weight: float = Field(default=0.2, ge=0, description="Added when a tool call ran.")
    seed: int = Field(default=0, description="Seed of the question generator.")


def make_question(rng: random.Random) -> dict:
    (first, second), (a, b) = rng.sample(sorted(PRICES), 2), (rng.randint(2, 9), rng.randint(2, 9))
    question = f"A class buys {a} of item '{first}' and {b} of item '{second}'. How many dollars "
    return {
        "question": question + "is that in total?",
        "answer": a * PRICES[first] + b * PRICES[second],
    }


def calculate(expression: str) -> float:
    """Arithmetic on numbers with + - * / and parentheses, by walking the syntax tree.

    >>> calculate("3 * (4 + 2) - 10 / 4")
    15.5
    """

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            result = _OPERATORS[type(node.op)](value(node.left), value(node.right))
            if abs(result) > 1e12:
                raise ValueError("the result is too large")
            return result
        raise ValueError("only numbers, + - * / and parentheses are allowed")

    if len(expression) > 200:
        raise ValueError("the expression is longer than 200 characters")
    return value(ast.parse(expression, mode="eval").body)


def run_tool(name: str, arguments: str) -> str:
    """A tool call's answer (errors too: they go back to the model as the tool's text).

    >>> run_tool("price", '{"item": "Pen"}'), run_tool("calculate", '{"expression": "7*3"}')
    ('2', '21')
    >>> run_tool("calculate", '{"expression": "__import__(1)"}')
    'error: only numbers, + - * / and parentheses are allowed'
    >>> run_tool("calculate", '{"expression": 7'), run_tool("shop", "{}")
    ('error: the arguments are not a JSON object', "error: no tool named 'shop'")
    """
    try:
        arguments = loads_model_output(arguments)
    except ModelOutputError:
        arguments = None
    if not isinstance(arguments, dict):
        return "error: the arguments are not a JSON object"
    try:
        if name == "price":
            item = str(arguments.get("item", "")).strip().lower()
            if item not in PRICES:
                raise ValueError(f"unknown item {item!r}; known: {', '.join(sorted(PRICES))}")
            return str(PRICES[item])
        if name == "calculate":
            result = calculate(str(arguments.get("expression", "")))
            return str(int(result)) if result == int(result) else f"{result:.6g}"
    except (ValueError, SyntaxError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return f"error: no tool named {name!r}"


async def run_agent(
    base_url: str, api_key: str, question: str, *, max_turns: int, max_tokens: int
) -> list:
    """The agent: plain OpenAI chat with tools against ``base_url``; it runs the model's tool
    calls, nudges a reply with neither a call nor an answer, and stops at an answer or after
    ``max_turns`` replies. Returns the conversation."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    async with client:
        for turn in range(max_turns):
            completion = await client.chat.completions.create(
                model="policy", messages=messages, tools=TOOLS, max_tokens=max_tokens
            )
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls or []:
                answer = run_tool(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
            if not message.tool_calls and extract_answer_tag(message.content or "") is not None:
                break
            if not message.tool_calls and turn < max_turns - 1:
                messages.append({"role": "user", "content": NUDGE})
    return messages


def agent_reward(messages: list, answer: int, tool_weight: float = 0.2) -> float:
    """1.0 for the right total in the last reply's ``<answer>``, plus ``tool_weight`` if a
    tool call ran without error.

    >>> tool = {"role": "tool", "content": "3"}
    >>> agent_reward([tool, {"role": "assistant", "content": "<answer>$19</answer>"}], 19)
    1.2
    >>> agent_reward([{"role": "assistant", "content": "19"}], 19)
    0.0
    """
    last = next((m for m in reversed(messages) if m["role"] == "assistant"), {})
    tagged = extract_answer_tag(str(last.get("content") or ""))
    correct = tagged is not None and normalize_number(tagged) == str(answer)
    ran = any(m["role"] == "tool" and not m["content"].startswith("error") for m in messages)
    return round(float(correct) + tool_weight * ran, 6)


class OpenAIAgentEnv(BaseEnv):
    name = "openai_agent"
    env_config_cls = OpenAIAgentConfig

    @classmethod
    def config_init(cls) -> tuple[OpenAIAgentConfig, list[APIServerConfig]]:
        config = OpenAIAgentConfig(tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
                                   group_size=8, max_token_length=2048, total_steps=500,
                                   steps_per_eval=0)  # fmt: skip
        return config, [APIServerConfig(model_name="default", base_url="http://localhost:9001/v1",
                                        server_type="embedded")]  # fmt: skip

    async def setup(self) -> None:
        self.rng = random.Random(self.config.seed)

    async def get_next_item(self) -> Item:
        return make_question(self.rng)

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        async with serve_proxy(self.server, self.tokenizer) as proxy:
            episodes = await asyncio.gather(
                *(self.episode(proxy, item) for _ in range(self.config.group_size))
            )
        trajectories, scores = zip(*episodes, strict=True)
        params = {"temperature": self.config.temperature,
                  "max_tokens": self.config.max_completion_tokens}  # fmt: skip
        return trajectory_group(trajectories, scores, generation_params=params), []

    async def episode(self, proxy: LocalProxy, item: Item) -> tuple[Trajectory, float]:
        """One agent run in its own proxy session: the recorded trajectory and its score. The
        agent holds the session's token, which opens that session only."""
        session = await proxy.open_session(temperature=self.config.temperature)
        async with session:  # leaving it collects the nodes and closes the session
            messages = await run_agent(session.get_url(), session.api_key, item["question"],
                                       max_turns=self.config.max_turns,
                                       max_tokens=self.config.max_completion_tokens)  # fmt: skip
        nodes = session.get_state()["nodes"]
        if len(nodes) != 1:
            logger.warning("the agent's session has %d nodes; training the last", len(nodes))
        chat = [{**tool_calls_as_text(m), "content": tool_calls_as_text(m).get("content") or ""}
                for m in messages]  # fmt: skip
        score = agent_reward(messages, item["answer"], self.config.tool_weight)
        return node_trajectory(nodes[-1], chat), score


if __name__ == "__main__":
    OpenAIAgentEnv.cli()
