"""Runs the tests in the supervisor, outside the model's process, against remote functions.

Each test (``assert f(2) == 4``, HumanEval's ``check(candidate)``...) executes here, in trusted
code. A name the test takes from the program becomes a :class:`RemoteFunction`: calling it sends
the arguments to the worker as plain data and gets back only the plain value it returned (or the
name of the exception it raised). The comparison, the expected values and the verdict never
exist in the worker's memory, so patched builtins, ``__eq__`` overrides, frame walking, forged
reports, ``sys.exit`` or a surviving fork change nothing here.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import signal
import sys
import time
from typing import Any

import _wire


class WorkerGone(Exception):
    """The worker died or stopped answering in the middle of a test."""


class TestTimeout(BaseException):
    """The test's time limit (a BaseException: ``except Exception`` in a test cannot stop it)."""


class RemoteError(Exception):
    """An exception the program raised that has no builtin counterpart here."""


class RemoteFunction:
    """A function of the program: each call runs in the worker, on copies of the arguments."""

    def __init__(self, judge: Judge, name: str) -> None:
        self.judge, self.__name__ = judge, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.judge.call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<function {self.__name__} of the sandboxed program>"


def free_names(source: str) -> list[str]:
    """Names the test reads but never binds itself (candidates to take from the program)."""
    tree = ast.parse(source)
    loaded: set[str] = set()
    bound: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return sorted(name for name in loaded - bound if not hasattr(builtins, name))


def _remote_exception(answer: dict[str, Any]) -> Exception:
    name, message = str(answer.get("raised")), str(answer.get("message", ""))[:2000]
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:  # exceptions whose constructor wants more (UnicodeDecodeError)
            pass
    return RemoteError(f"{name}: {message}")


def _on_alarm(signum: int, frame: Any) -> None:
    raise TestTimeout


class Judge:
    def __init__(self, sandbox: Any, worker: Any, limits: dict[str, Any]) -> None:
        self.sandbox, self.worker, self.limits = sandbox, worker, limits
        self.deadline = worker.started + limits["wall_seconds"]
        self.stdout, self.stderr = bytearray(), bytearray()
        self.status = "ok"

    def run(self, tests: dict[str, Any]) -> dict[str, Any]:
        sources: list[str] = tests["tests"]
        if self.worker.pump(self.deadline, want_frame=True) is None:  # the program's top level
            self.worker.wait(self.deadline)
            return {"runs": [self.worker.report()], "tests_passed": [False] * len(sources)}
        namespace: dict[str, Any] = {"__name__": "__test__", "__builtins__": builtins}
        exec(compile(tests["setup"], "test_setup.py", "exec"), namespace)
        for name in tests["solution_names"]:
            namespace[name] = RemoteFunction(self, name)
        signal.signal(signal.SIGALRM, _on_alarm)
        outcomes = []
        for source in sources:
            if self.status != "ok" or time.monotonic() >= self.deadline:
                self.status = "timeout" if self.status == "ok" else self.status
                outcomes.append(False)
                continue
            outcomes.append(self._one(source, namespace))
        self._retire(None)
        run = self.worker.report()
        run.update(status=self.status, exit_code=0 if self.status == "ok" else None,
                   stdout=self.stdout[: self.limits["output_bytes"]].decode(errors="replace"),
                   stderr_tail=self._stderr_tail())  # fmt: skip
        return {"runs": [run], "tests_passed": outcomes}

    def _one(self, source: str, namespace: dict[str, Any]) -> bool:
        try:
            code = compile(source, "test.py", "exec")
            names = free_names(source)
        except SyntaxError:
            return False
        if not self.worker.alive and not self._restart():
            return False
        seconds = min(self.limits["test_seconds"], self.deadline - time.monotonic())
        try:
            # The alarm is disarmed before any handler runs: the run's wall clock can end a
            # test a moment before its alarm, which would otherwise fire inside the kill below.
            signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
            try:
                self._resolve(names, namespace)
                exec(code, namespace)
                return True
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except TestTimeout:
            self._retire("timeout")
            return False
        except WorkerGone:
            self._retire(None)
            return False
        except BaseException:  # the test failed: assertion, remote exception, bad value...
            return False

    def _resolve(self, names: list[str], namespace: dict[str, Any]) -> None:
        missing = [name for name in names if name not in namespace]
        if not missing:
            return
        answer = self.ask({"op": "describe", "names": missing})
        kinds, values = answer.get("kinds"), answer.get("values")
        kinds = kinds if isinstance(kinds, dict) else {}
        values = values if isinstance(values, dict) else {}
        for name in missing:
            kind = kinds.get(name)
            if kind == "callable":
                namespace[name] = RemoteFunction(self, name)
            elif kind == "module" and name in sys.stdlib_module_names:
                namespace[name] = importlib.import_module(name)
            elif kind == "value" and name in values:
                namespace[name] = _wire.from_plain(values[name])

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        request = {"op": "call", "name": name, "args": _wire.to_plain(list(args)),
                   "kwargs": _wire.to_plain(kwargs)}  # fmt: skip
        answer = self.ask(request)
        if "raised" in answer:
            raise _remote_exception(answer)
        if "value" not in answer:
            raise WorkerGone("the worker's answer holds no value")
        after = answer.get("args_after")
        for key, data in after.items() if isinstance(after, dict) else ():
            index = int(key) if str(key).isdigit() else -1
            if 0 <= index < len(args):
                _update_in_place(args[index], _wire.from_plain(data))
        return _wire.from_plain(answer["value"])

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        if not self.worker.alive:
            raise WorkerGone("the worker is not running")
        try:
            _wire.write_frame(self.worker.request_fd, request)
        except OSError as error:
            raise WorkerGone(f"the worker stopped reading: {error}") from None
        answer = self.worker.pump(self.deadline, want_frame=True)
        if answer is not None:
            return answer
        if self.worker.alive:  # the run's wall-clock limit
            raise TestTimeout
        if self.worker.killed_for == "output_limit":
            self.status = "output_limit"
        raise WorkerGone("the worker ended during the call")

    def _restart(self) -> bool:
        """A fresh interpreter (not a fork: this process now holds the tests) runs the program."""
        self.worker = type(self.worker)(self.sandbox, b"", serve=True, fresh=True)
        if self.worker.pump(self.deadline, want_frame=True) is not None:
            return True
        self._retire("timeout" if self.worker.alive else None)
        return False

    def _retire(self, reason: str | None) -> None:
        self.worker.kill(reason)
        if self.worker.killed_for == "output_limit":
            self.status = "output_limit"
        self.stdout += self.worker.stdout
        self.stderr += self.worker.stderr
        self.worker.stdout, self.worker.stderr = bytearray(), bytearray()

    def _stderr_tail(self) -> str:
        tail = self.limits["stderr_tail_bytes"]
        return bytes(self.stderr[-tail:] if tail else b"").decode(errors="replace")


def _update_in_place(target: Any, value: Any) -> None:
    """The test sees an argument changed the way the function changed its copy."""
    if isinstance(target, list) and isinstance(value, list):
        target[:] = value
    elif isinstance(target, dict | set) and isinstance(value, type(target)):
        target.clear()
        target.update(value)
    elif isinstance(target, bytearray) and isinstance(value, bytes):
        target[:] = value
