"""The untrusted side: runs the model's program, then answers the judge's calls with plain data.

Everything here runs in the sandboxed process next to the model's code, which may rewrite any of
it; nothing here decides a verdict. The judge only ever gets back what a function returned (or
the name of the exception it raised), decoded into fresh plain values in its own process.

Started either as a fork of the supervisor (before it has read any test) or, after a test timed
out or killed the worker, as ``python -s -S -P _worker.py FD`` (a fresh interpreter: the judge's
memory, tests included, is not inherited).
"""

from __future__ import annotations

import builtins
import os
import sys
import traceback
from typing import Any

if __name__ == "__main__":  # a fresh interpreter: -P leaves the script's folder off sys.path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _wire

EXIT_OK, EXIT_RUNTIME, EXIT_MEMORY = 0, 1, 3
REQUEST_FD, RESPONSE_FD = 3, 4
_KINDS = ("callable", "module", "value", "missing")


def run(program: Any, serve: bool) -> int:
    """Run ``program`` as ``__main__``; with ``serve``, then answer calls until end of file."""
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(program, namespace)
    except MemoryError as error:
        _print_user_traceback(error)
        return EXIT_MEMORY
    except SystemExit as stop:
        if stop.code not in (None, 0):
            return EXIT_RUNTIME
    except BaseException as error:
        _print_user_traceback(error)
        return EXIT_RUNTIME
    if serve:
        sys.stdout.flush()
        _wire.write_frame(RESPONSE_FD, {"ready": True})
        _serve(namespace)
    return EXIT_OK


def _serve(namespace: dict[str, Any]) -> None:
    while True:
        request = _wire.read_frame(REQUEST_FD)
        if request is None:
            return
        if request.get("op") == "describe":
            answer = _describe(namespace, request.get("names") or [])
        else:
            answer = _call(namespace, request)
        sys.stdout.flush()
        sys.stderr.flush()
        _wire.write_frame(RESPONSE_FD, answer)


def _describe(namespace: dict[str, Any], names: list[str]) -> dict[str, Any]:
    kinds: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name in names:
        if name not in namespace:
            kinds[name] = "missing"
            continue
        value = namespace[name]
        if isinstance(value, type(sys)):
            kinds[name] = "module"
        elif callable(value):
            kinds[name] = "callable"
        else:
            try:
                values[name] = _wire.to_plain(value)
                kinds[name] = "value"
            except TypeError:
                kinds[name] = "missing"
    return {"kinds": kinds, "values": values}


def _call(namespace: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    try:
        function = namespace[request["name"]]
        args = _wire.from_plain(request["args"])
        kwargs = _wire.from_plain(request["kwargs"])
        result = function(*args, **kwargs)
        answer: dict[str, Any] = {"value": _wire.to_plain(result)}
        mutable = [
            i for i, arg in enumerate(args) if isinstance(arg, list | dict | set | bytearray)
        ]
        if mutable:
            answer["args_after"] = {str(i): _wire.to_plain(args[i]) for i in mutable}
        return answer
    except KeyError as error:
        if error.args == (request.get("name"),):
            return {"raised": "NameError", "message": f"name {error.args[0]!r} is not defined"}
        return {"raised": "KeyError", "message": str(error)}
    except BaseException as error:
        return {"raised": type(error).__name__, "message": str(error)[:2000]}


def _print_user_traceback(error: BaseException) -> None:
    """The traceback from the program's own frames (this module's frame left out)."""
    tb = error.__traceback__.tb_next if error.__traceback__ else None
    traceback.print_exception(type(error), error, tb)


def main() -> int:
    """Fresh-interpreter start: the program (source) arrives on the file descriptor in argv."""
    with os.fdopen(int(sys.argv[1]), "rb") as handle:
        spec = _wire.loads(handle.read())
    sys.path.extend(spec["site_packages"])
    if spec["audit_hook"]:  # no namespaces: the fallback's hook, before any of the program runs
        import _confine

        _confine.block_with_audit_hook()
    program = compile(spec["code"], "solution.py", "exec")
    code = EXIT_RUNTIME
    try:
        code = run(program, serve=bool(spec["serve"]))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


if __name__ == "__main__":
    os._exit(main())
