"""vf-arith: a verifiers (v1) taskset shipped as the adapter's offline example.

Single-turn sums of two one-digit numbers; two weighted rewards: the right number in
``<answer></answer>`` tags (1.0) and the tags at all (0.25).
"""

import random
import re

import verifiers.v1 as vf

_ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def answer_of(reply: str) -> str | None:
    found = _ANSWER.search(reply)
    return found.group(1) if found else None


class ArithData(vf.TaskData):
    answer: str


class ArithTask(vf.Task[ArithData]):
    @vf.stop
    async def one_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(answer_of(trace.last_reply or "") == self.data.answer)

    @vf.reward(weight=0.25)
    async def tagged(self, trace: vf.Trace) -> float:
        return float(answer_of(trace.last_reply or "") is not None)


class ArithConfig(vf.TasksetConfig):
    size: int = 200
    seed: int = 0


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for index in range(self.config.size):
            a, b = rng.randrange(10), rng.randrange(10)
            data = ArithData(
                idx=index,
                prompt=f"What is {a} + {b}? Put the number in <answer></answer> tags.",
                answer=str(a + b),
            )
            tasks.append(ArithTask(data, self.config.task))
        return tasks


__all__ = ["ArithTaskset"]
