"""Environments of other ecosystems for the adapter tests.

``SINGLE_TURN``, ``MULTI_TURN`` and ``TOOL_USE`` (with its MCP tool server ``TOOL_SERVER``)
are verifiers (v1) environments written here in the verifiers API; ``write_vf_envs`` puts
them in a folder as importable packages (a tool server needs that folder on ``PYTHONPATH``:
verifiers starts it as ``python -m``). Their reward functions are module-level pure
functions, so a test can score a completion the way the environment does. The OpenEnv
environment is ``environments/openenv_env/guess_server.py``.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GUESS_SERVER = HERE.parents[1] / "environments" / "openenv_env" / "guess_server.py"

SINGLE_TURN = '''
"""Single-turn arithmetic with a two-function rubric (weights 1.0 and 0.5)."""
import verifiers.v1 as vf


def correct(reply: str, answer: str) -> float:
    return float(answer in reply)


def brevity(reply: str) -> float:
    return 1.0 / (1.0 + len(reply) / 40)


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def correct_answer(self, trace: vf.Trace) -> float:
        if "FAIL_REWARD" in (trace.last_reply or "") or self.data.answer == "boom":
            raise RuntimeError("the reward function crashed")
        return correct(trace.last_reply or "", self.data.answer)

    @vf.reward(weight=0.5)
    async def short_answer(self, trace: vf.Trace) -> float:
        return brevity(trace.last_reply or "")


class SumConfig(vf.TasksetConfig):
    size: int = 6
    offset: int = 0
    broken: bool = False


class SumTaskset(vf.Taskset[SumTask, SumConfig]):
    def load(self):
        return [
            SumTask(
                SumData(
                    prompt=f"What is {i + self.config.offset} + 2? Reply with the number.",
                    system_prompt="Answer briefly.",
                    answer="boom" if self.config.broken else str(i + self.config.offset + 2),
                ),
                self.config.task,
            )
            for i in range(self.config.size)
        ]


__all__ = ["SumTaskset"]
'''

MULTI_TURN = '''
"""Multi-turn: a scripted user asks for two numbers in turn; the reward is the share said."""
import verifiers.v1 as vf


def said(replies: list[str], numbers: list[int]) -> float:
    hits = [str(n) in reply for n, reply in zip(numbers, replies)]
    return sum(hits) / len(numbers)


class SayData(vf.TaskData):
    numbers: list[int]


class SayTask(vf.Task[SayData]):
    @vf.reward(weight=1.0)
    async def said_numbers(self, trace: vf.Trace) -> float:
        return said([m.content or "" for m in trace.assistant_messages], self.data.numbers)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        return float(trace.num_turns)


class SayEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as interaction:
            for number in task.data.numbers:
                if (await interaction.turn(f"Say the number {number}.")).terminated:
                    break


class SayTaskset(vf.Taskset[SayTask, vf.TasksetConfig]):
    def load(self):
        return [
            SayTask(SayData(prompt=None, numbers=[i, i + 3]), self.config.task) for i in range(4)
        ]


__all__ = ["SayEnv", "SayTaskset"]
'''


TOOL_SERVER = '''
"""The tool server of ``vf_add``: verifiers runs it as ``python -m vf_add.tools``."""
import verifiers.v1 as vf


class AddTools(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = None

    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


if __name__ == "__main__":
    AddTools.run()
'''

TOOL_USE = '''
"""A tool environment: the model may call ``add`` (an MCP tool server) before it answers."""
import verifiers.v1 as vf

from vf_add.tools import AddTools


class AddData(vf.TaskData):
    answer: str


class AddTask(vf.Task[AddData]):
    @classmethod
    def toolsets(cls, config):
        return [AddTools(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(self.data.answer in (trace.last_reply or ""))

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(sum(len(m.tool_calls or []) for m in trace.assistant_messages))


class AddTaskset(vf.Taskset[AddTask, vf.TasksetConfig]):
    def load(self):
        return [
            AddTask(AddData(prompt=f"What is {i} + 40? Use the add tool.", answer=str(i + 40)),
                    self.config.task)
            for i in range(3)
        ]


__all__ = ["AddTaskset"]
'''


def write_vf_envs(folder: Path) -> Path:
    """The environments as packages ``vf_sum``, ``vf_say`` and ``vf_add`` under ``folder``."""
    files = {
        "vf_sum/__init__.py": SINGLE_TURN,
        "vf_say/__init__.py": MULTI_TURN,
        "vf_add/__init__.py": TOOL_USE,
        "vf_add/tools.py": TOOL_SERVER,
    }
    for name, source in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(source))
    return folder


def import_vf_env(folder: Path, name: str) -> Any:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return __import__(name)
