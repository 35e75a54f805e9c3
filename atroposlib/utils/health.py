"""Waiting for a server to answer: the one poll loop of the launcher, the adapters, the
benchmarks and the tests.

``wait_healthy(url)`` returns once ``GET url`` answers 2xx; ``wait_healthy_async`` is the same
loop for a caller inside an event loop. Either raises :class:`NotHealthyError` when the deadline
passes, or as soon as the server's own process (``process``) exits, naming its exit code and, when
``log_path`` is given, the log with its last lines. A wait for a ``process`` also makes sure
that what answered is that process: once the URL answers, every socket listening on its port
must be held by the process or one of its descendants, else the error (one line) names the port
and its holder, and nothing is reported healthy (``own_port=False`` for a command whose port a
container runtime publishes).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import httpx

from atroposlib.errors import AtroposError
from atroposlib.utils.ports import foreign_listener, host_port

__all__ = ["NotHealthyError", "log_tail", "wait_healthy", "wait_healthy_async"]


class NotHealthyError(AtroposError):
    """A server did not answer 2xx before the deadline, or its process exited first
    (``exit_code`` is then its exit code, else None)."""

    def __init__(self, message: str, *, url: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.exit_code = exit_code


class Process(Protocol):
    """What the wait needs of a server's process: ``subprocess.Popen`` has it."""

    pid: int

    def poll(self) -> int | None: ...


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of ``path`` (read from its last 16 KiB); "" if it is missing."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16_384))
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class _Wait:
    url: str
    timeout_s: float
    process: Process | None
    log_path: Path | None
    name: str | None
    own_port: bool

    def check(self, deadline: float) -> None:
        """Raise if the process has exited or the deadline has passed."""
        code = self.process.poll() if self.process is not None else None
        if code is not None:
            raise self._error(f"exited with code {code} before it answered {self.url}", code)
        if time.monotonic() > deadline:
            raise self._error(f"did not answer {self.url} with 2xx within {self.timeout_s:g} s")

    def confirm_owner(self) -> None:
        """Raise, in one line naming the port, if another process holds the URL's port."""
        if self.process is None or not self.own_port:
            return
        host, port = host_port(self.url)
        holder = foreign_listener(host, port, self.process.pid)
        if holder is not None:
            raise NotHealthyError(
                f"{self.name or 'the server'}: {self.url} answered, but port {port} is held by "
                f"{holder}, not by the process we started (pid {self.process.pid}); stop that "
                "one or choose another port",
                url=self.url,
            )

    def _error(self, what: str, exit_code: int | None = None) -> NotHealthyError:
        message = f"{self.name or 'the server'} {what}"
        if self.log_path is not None:
            message += f"; last lines of {self.log_path}:\n{log_tail(self.log_path)}"
        return NotHealthyError(message, url=self.url, exit_code=exit_code)


def wait_healthy(
    url: str,
    *,
    timeout_s: float = 60.0,
    poll_s: float = 0.2,
    process: Process | None = None,
    log_path: Path | None = None,
    name: str | None = None,
    headers: Mapping[str, str] | None = None,
    client: httpx.Client | None = None,
    own_port: bool = True,
) -> None:
    """Poll ``GET url`` every ``poll_s`` until it answers 2xx (``name``: the server in the
    error, e.g. "the broker"; ``client``: the one to poll with, e.g. one carrying a key;
    ``own_port``: with ``process``, its tree must hold the URL's port)."""
    wait = _Wait(url, timeout_s, process, log_path, name, own_port)
    deadline = time.monotonic() + timeout_s
    http = client or httpx.Client(timeout=min(5.0, timeout_s))
    try:
        while True:
            wait.check(deadline)
            try:
                answered = http.get(url, headers=headers).is_success
            except httpx.RequestError:
                answered = False
            if answered:
                wait.confirm_owner()
                return
            time.sleep(poll_s)
    finally:
        if client is None:
            http.close()


async def wait_healthy_async(
    url: str,
    *,
    timeout_s: float = 60.0,
    poll_s: float = 0.2,
    process: Process | None = None,
    log_path: Path | None = None,
    name: str | None = None,
    headers: Mapping[str, str] | None = None,
    own_port: bool = True,
) -> None:
    """:func:`wait_healthy` for a caller in an event loop: it sleeps without blocking it."""
    wait = _Wait(url, timeout_s, process, log_path, name, own_port)
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=min(5.0, timeout_s)) as http:
        while True:
            wait.check(deadline)
            try:
                answered = (await http.get(url, headers=headers)).is_success
            except httpx.RequestError:
                answered = False
            if answered:
                wait.confirm_owner()
                return
            await asyncio.sleep(poll_s)
