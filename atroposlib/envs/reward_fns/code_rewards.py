"""Code rewards: pull the program out of a reply, run it in the sandbox, score how it ended."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

from atroposlib.envs.reward_fns.registry import completion_text, register_reward
from atroposlib.sandbox import SandboxLimits, SandboxResult, SandboxStatus, run_python

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_EXECUTION_REWARD = {
    SandboxStatus.SYNTAX_ERROR: -0.5,
    SandboxStatus.RUNTIME_ERROR: -1.0,
    SandboxStatus.TIMEOUT: -1.0,
    SandboxStatus.MEMORY: -1.0,
    SandboxStatus.OUTPUT_LIMIT: -1.0,
}


def extract_python_code(text: str) -> str:
    """The last fenced code block (```python, ```py or bare ```), else the whole reply.

    >>> extract_python_code("Here:\\n```python\\nprint(1)\\n```\\nand\\n```\\nprint(2)\\n```")
    'print(2)\\n'
    >>> extract_python_code("print(3)")
    'print(3)'
    """
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text.strip()


def execution_reward(result: SandboxResult) -> float:
    """+1.0 ran with output, +0.5 ran silently, -0.5 syntax/indentation error, -1.0 otherwise.

    >>> from atroposlib.sandbox import Isolation
    >>> def ran(status, out=""):
    ...     return SandboxResult(status=status, stdout=out, stderr_tail="", duration_s=0.1,
    ...                          exit_code=0, isolation=Isolation.NAMESPACES)
    >>> runs = [ran(SandboxStatus.OK, "hi"), ran(SandboxStatus.OK),
    ...         ran(SandboxStatus.SYNTAX_ERROR), ran(SandboxStatus.TIMEOUT)]
    >>> [execution_reward(run) for run in runs]
    [1.0, 0.5, -0.5, -1.0]
    """
    if result.status is SandboxStatus.OK:
        return 1.0 if result.stdout.strip() else 0.5
    return _EXECUTION_REWARD[result.status]


@register_reward("code_execution")
def code_execution_reward(
    completions: Sequence[Any], limits: SandboxLimits | None = None, **_: object
) -> list[float]:
    """:func:`execution_reward` of each reply's program, run in the sandbox.

    >>> code_execution_reward(["```python\\nprint(6 * 7)\\n```", "x = 1", "def f(:", "1/0"])
    [1.0, 0.5, -0.5, -1.0]
    """
    codes = [extract_python_code(completion_text(c)) for c in completions]
    return [execution_reward(run_python(code, limits=limits)) for code in codes]


@register_reward("test_pass_rate")
def pass_rate_reward(
    completions: Sequence[Any],
    tests: Sequence[Sequence[str]],
    limits: SandboxLimits | None = None,
    **_: object,
) -> list[float]:
    """Fraction of a problem's asserts each reply's program passes (0.0 when it cannot run).

    >>> pass_rate_reward(
    ...     ["def sq(x):\\n    return x * x", "def sq(x):\\n    return 2 * x", "def sq(x) return"],
    ...     [["assert sq(2) == 4", "assert sq(3) == 9"]] * 3,
    ... )
    [1.0, 0.5, 0.0]
    """
    scores = []
    for completion, problem_tests in zip(completions, tests, strict=True):
        code = extract_python_code(completion_text(completion))
        scores.append(run_python(code, tests=list(problem_tests), limits=limits).pass_rate)
    return scores


def tested_functions(reference: str, tests: Sequence[str]) -> list[str]:
    """Functions the reference solution defines at top level that the tests call: the names the
    judge must always take from the reply, even one that shadows a builtin (MBPP's ``max``...).

    >>> tested_functions("def max(a, b):\\n    return a\\ndef helper():\\n    pass",
    ...                  ["assert max(1, 2) == 2"])
    ['max']
    >>> tested_functions("def f(:", ["assert f()"])
    []
    """
    try:
        tree = ast.parse(reference)
    except SyntaxError:
        return []
    defined = [node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)]
    called = {node.id for test in tests for node in ast.walk(ast.parse(test))
              if isinstance(node, ast.Name)}  # fmt: skip
    return [name for name in defined if name in called]


def outputs_match(expected: str | None, actual: str) -> bool:
    """Outputs match line by line, ignoring trailing whitespace and blank lines at the ends.

    >>> outputs_match("[1, 2]  ", "[1, 2]\\n"), outputs_match("[1,2]", "[1, 2]\\n")
    (True, False)
    >>> outputs_match(None, "")
    False
    """
    if expected is None:
        return False
    return [line.rstrip() for line in expected.strip().splitlines()] == [
        line.rstrip() for line in actual.strip().splitlines()
    ]


def io_reward(runs: Sequence[SandboxResult], expected: Sequence[str]) -> float:
    """Stdin/stdout tasks: 1.0 when every case's run ends OK with the expected output; else
    0.0, or the execution reward when the program cannot run (-0.5 syntax, -1.0 runtime error or
    timeout on a case). The expected outputs never reach the sandbox: compared here.

    >>> from atroposlib.sandbox import Isolation
    >>> def ran(out, status=SandboxStatus.OK):
    ...     return SandboxResult(status=status, stdout=out, stderr_tail="", duration_s=0.1,
    ...                          exit_code=0, isolation=Isolation.NAMESPACES)
    >>> io_reward([ran("3\\n"), ran("7")], ["3", "7"]), io_reward([ran("3"), ran("3")], ["3", "7"])
    (1.0, 0.0)
    >>> io_reward([ran("3"), ran("", SandboxStatus.TIMEOUT)], ["3", "7"])
    -1.0
    """
    if len(runs) != len(expected):
        raise ValueError(f"{len(runs)} runs for {len(expected)} expected outputs")
    for run in runs:
        if not run.ok:
            return execution_reward(run)
    pairs = zip(runs, expected, strict=True)
    return float(all(outputs_match(want, run.stdout) for run, want in pairs))


def pass_at_k(samples: int, correct: int, k: int) -> float:
    """Unbiased pass@k from ``samples`` tries of which ``correct`` passed: 1 - C(n-c, k) / C(n, k).

    >>> pass_at_k(10, 0, 1), pass_at_k(10, 10, 5), round(pass_at_k(10, 3, 1), 6)
    (0.0, 1.0, 0.3)
    >>> round(pass_at_k(10, 3, 5), 4)
    0.9167
    """
    if not 0 <= correct <= samples or k < 1 or k > samples:
        raise ValueError(f"need 0 <= correct <= samples and 1 <= k <= samples (got {samples=}, "
                         f"{correct=}, {k=}); ask for at least k samples per problem")  # fmt: skip
    if samples - correct < k:
        return 1.0
    product = 1.0
    for i in range(samples - correct + 1, samples + 1):
        product *= 1.0 - k / i
    return 1.0 - product
