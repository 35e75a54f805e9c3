"""Every control call goes to every inference server of the fleet, in parallel.

A server that answers an error, times out or cannot be reached is named in the
:class:`SyncFailure` raised once every server has answered (the others' answers are kept).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

logger = logging.getLogger(__name__)
T = TypeVar("T")


class SyncFailure(Exception):
    """One or more servers did not take a step of a weight update; ``by_server`` says why.

    ``final``: trying again cannot help (the server refused these weights, or its engine is
    dead), so the push stops at once instead of being retried.
    """

    def __init__(self, by_server: Mapping[str, str], *, final: bool = False) -> None:
        self.by_server = dict(by_server)
        self.final = final
        super().__init__("; ".join(f"{url}: {why}" for url, why in self.by_server.items()))


class Fleet:
    """The inference servers a trainer updates, with one HTTP client and a thread per server."""

    def __init__(
        self,
        urls: list[str],
        *,
        timeout: float = 300.0,
        api_key: str | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = http_client or httpx.Client(timeout=timeout, headers=headers)
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self.urls)))

    def each(self, call: Callable[[str], T], urls: list[str] | None = None) -> dict[str, T]:
        """``call(url)`` for every server at once; SyncFailure names each one that raised."""
        targets = urls if urls is not None else self.urls
        futures = {url: self._pool.submit(call, url) for url in targets}
        answers: dict[str, T] = {}
        failed: dict[str, str] = {}
        final = False
        for url, future in futures.items():
            try:
                answers[url] = future.result()
            except SyncFailure as error:
                failed.update(error.by_server)
                final = final or error.final
            except (httpx.HTTPError, OSError, ValueError, RuntimeError) as error:
                failed[url] = f"{type(error).__name__}: {error}"
        if failed:
            raise SyncFailure(failed, final=final)
        return answers

    def request(self, method: str, url: str, path: str, **kwargs: Any) -> Any:
        """One call to one server; its JSON answer (or None); SyncFailure on an error status.

        An answer ``{"success": false, ...}`` (SGLang's refusals) is an error too. A connection
        the server closed while it sat in the pool (vLLM closes it after an error answer) is
        replaced once.
        """
        try:
            try:
                response = self.client.request(method, url + path, **kwargs)
            except (httpx.RemoteProtocolError, httpx.ReadError):
                response = self.client.request(method, url + path, **kwargs)
        except httpx.HTTPError as error:
            raise SyncFailure({url: f"{path}: {type(error).__name__}: {error}"}) from error
        body: Any = None
        if "json" in response.headers.get("content-type", ""):
            try:
                body = response.json()
            except ValueError:
                body = None
        if not response.is_success:
            said = _said(response)
            raise SyncFailure(
                {url: f"{path} answered HTTP {response.status_code}: {said}"},
                final=_is_final(response.status_code, said),
            )
        if isinstance(body, dict) and body.get("success") is False:
            raise SyncFailure({url: f"{path} refused: {body.get('message') or body}"})
        return body

    def post_all(self, path: str, urls: list[str] | None = None, **kwargs: Any) -> dict[str, Any]:
        """POST the same body to every server at once; their JSON answers by URL."""
        return self.each(lambda url: self.request("POST", url, path, **kwargs), urls)

    def get_all(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return self.each(lambda url: self.request("GET", url, path, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.client.close()


_WORKER_ERROR = re.compile(r"Worker failed with error '(.*)', please check", re.DOTALL)
_DEAD_ENGINE = "EngineCore encountered an issue"


def _said(response: httpx.Response) -> str:
    """The server's own message, on one line: vLLM's ``{"error": {"message"}}`` (a worker's
    exception unwrapped from vLLM's RPC wording), ``{"detail"}``, else the body's start."""
    said = response.text
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            said = str(error["message"])
        elif body.get("detail"):
            said = str(body["detail"])
    worker = _WORKER_ERROR.search(said)
    if worker:
        said = f"refused: {worker.group(1)}"
    return " ".join(said.split())[:300]


def _is_final(status: int, said: str) -> bool:
    """A refusal or a dead engine: the same push would fail the same way again."""
    refused = 400 <= status < 500 and status not in (408, 409, 429)
    return refused or said.startswith("refused: ") or _DEAD_ENGINE in said
