"""A session on the managed-server proxy, used like a managed server.

    managed = await create_proxy_session("http://localhost:9100", api_key=proxy_key)
    async with managed:
        agent = openai.AsyncOpenAI(base_url=managed.get_url(), api_key=managed.api_key)
        ...                                  # the agent's own loop, any OpenAI client
        nodes = (await managed.fetch_state())["nodes"]   # token-exact, for training

``chat_completion`` / ``get_state`` / ``reset`` work as on an in-process managed server; leaving
the ``async with`` block fetches the nodes one last time and closes the session. The proxy's
key opens the session; from then on the session's own token (``managed.api_key``) is the only
credential its routes take, so the agent is handed a key that opens its session and nothing
else.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

import httpx
from openai.types.chat import ChatCompletion
from openai.types.completion import Completion

from atroposlib.envs.server_handling.managed import SequenceNode
from atroposlib.envs.trajectory import Trajectory, finish_reason
from atroposlib.errors import InferenceError, InferenceRejectedError
from atroposlib.group import MASK_IGNORE_INDEX, NOT_SAMPLED_VERSION
from atroposlib.proxy.protocol import (
    NodesResponse,
    ProxyChatCompletion,
    SessionCreateRequest,
    SessionCreateResponse,
)
from atroposlib.type_definitions import Message

logger = logging.getLogger(__name__)

_REQUEST_KEYS = ("max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
                 "seed", "tools", "tool_choice")  # fmt: skip


class ProxyError(InferenceError):
    """The proxy answered 5xx or could not be reached."""


class ProxyRejectedError(InferenceRejectedError):
    """The proxy refused the request (4xx); ``detail`` names the field."""

    def __init__(self, status_code: int, detail: str) -> None:
        super().__init__(f"proxy answered {status_code}: {detail}")
        self.status_code = status_code
        self.detail = detail


async def _call(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> Any:
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        raise ProxyError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code >= 400:
        try:
            detail = str(response.json().get("detail"))
        except ValueError:
            detail = response.text[:300]
        if response.status_code < 500:
            raise ProxyRejectedError(response.status_code, detail)
        raise ProxyError(f"{method} {url}: HTTP {response.status_code}: {detail}")
    return response.json()


class ProxyManagedServer:
    """One proxy session: the agent's URL, chat completions, and the recorded nodes."""

    def __init__(
        self,
        proxy_url: str,
        session_uuid: str,
        model_name: str = "unknown",
        base_url: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        session_token: str | None = None,
    ) -> None:
        self.proxy_url = proxy_url.rstrip("/")
        self.session_uuid = session_uuid
        self.model_name = model_name
        self.base_url = base_url
        self.session_token = session_token
        self._owns_client = http_client is None
        self.http = http_client or httpx.AsyncClient(timeout=httpx.Timeout(1200, connect=10))
        self._nodes: list[SequenceNode] | None = None

    def get_url(self) -> str:
        """The session's OpenAI base URL: ``openai.OpenAI(base_url=...)``."""
        return f"{self.proxy_url}/{self.session_uuid}/v1"

    @property
    def api_key(self) -> str:
        """The session's token, the agent's ``openai.OpenAI(api_key=...)`` (a proxy without
        keys, which returns none, takes any)."""
        return self.session_token or "no-key"

    def _auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.session_token}"} if self.session_token else {}

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        body = {key: kwargs[key] for key in _REQUEST_KEYS if kwargs.get(key) is not None}
        body["messages"] = [dict(message) for message in kwargs["messages"]]
        url = f"{self.get_url()}/chat/completions"
        data = await _call(self.http, "POST", url, json=body, headers=self._auth())
        checked = ProxyChatCompletion.model_validate(data)
        return ChatCompletion.model_validate(checked.model_dump(exclude_none=True))

    async def completion(self, **kwargs: Any) -> Completion:
        raise NotImplementedError(
            "a proxy session serves chat completions only; use chat_completion()"
        )

    async def fetch_state(self) -> dict[str, list[SequenceNode]]:
        """The session's recorded nodes, fetched now (and cached for ``get_state``)."""
        url = f"{self.proxy_url}/{self.session_uuid}/nodes"
        data = await _call(self.http, "GET", url, headers=self._auth())
        self._nodes = NodesResponse.model_validate(data).nodes
        return {"nodes": list(self._nodes)}

    def get_state(self) -> dict[str, list[SequenceNode]]:
        """The nodes last fetched (``fetch_state``; leaving ``async with`` fetches them)."""
        return {"nodes": list(self._nodes or [])}

    def reset(self) -> None:
        self._nodes = None

    async def cleanup(self) -> None:
        """Close the session on the proxy (already closed: nothing to do)."""
        try:
            url = f"{self.proxy_url}/{self.session_uuid}"
            await _call(self.http, "DELETE", url, headers=self._auth())
        except ProxyRejectedError as exc:
            if exc.status_code != 404:
                raise
        finally:
            if self._owns_client:
                await self.http.aclose()

    async def __aenter__(self) -> ProxyManagedServer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.fetch_state()
        except InferenceError as error:
            logger.warning("could not fetch proxy session %s: %s", self.session_uuid, error)
        await self.cleanup()


async def create_proxy_session(
    proxy_url: str,
    base_url: str | None = None,
    tool_parser: str = "hermes",
    track_tree: bool = False,
    model_name: str = "unknown",
    temperature: float | None = None,
    http_client: httpx.AsyncClient | None = None,
    api_key: str | None = None,
) -> ProxyManagedServer:
    """Open a session on the proxy at ``proxy_url`` (pinned to ``base_url`` if given) with
    the proxy's ``api_key``; the session keeps the token the proxy returns for its routes."""
    request = SessionCreateRequest(
        tool_parser=tool_parser, track_tree=track_tree, base_url=base_url, temperature=temperature
    )
    url = f"{proxy_url.rstrip('/')}/sessions/create"
    body = request.model_dump(exclude_none=True)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    if http_client is None:
        async with httpx.AsyncClient(timeout=30) as client:
            data = await _call(client, "POST", url, json=body, headers=headers)
    else:
        data = await _call(http_client, "POST", url, json=body, headers=headers)
    created = SessionCreateResponse.model_validate(data)
    return ProxyManagedServer(
        proxy_url, created.uuid, created.model_name or model_name, created.base_url, http_client,
        session_token=created.session_token,
    )  # fmt: skip


def node_trajectory(node: SequenceNode, messages: list[Message]) -> Trajectory:
    """A recorded node as a trajectory for ``trajectory_group``: its ids, masks and logprobs
    as recorded; each sampled id tagged with the node's (oldest) weight version."""
    metadata = node.metadata or {}
    version = metadata.get("weight_version")
    sampled = NOT_SAMPLED_VERSION if version is None else int(version)
    versions = [NOT_SAMPLED_VERSION if m == MASK_IGNORE_INDEX else sampled
                for m in node.masked_tokens]  # fmt: skip
    replies = [m for m in messages if m.get("role") == "assistant"]
    last = replies[-1].get("content") if replies else None
    starts = [i for i in range(1, len(node.masked_tokens))
              if node.masked_tokens[i] != MASK_IGNORE_INDEX
              and node.masked_tokens[i - 1] == MASK_IGNORE_INDEX]  # fmt: skip
    first = next((i for i, m in enumerate(node.masked_tokens) if m != MASK_IGNORE_INDEX), 0)
    return Trajectory(
        tokens=list(node.tokens),
        masks=list(node.masked_tokens),
        logprobs=list(node.logprobs),
        versions=versions,
        messages=list(messages),
        finish_reason=finish_reason(metadata.get("finish_reason")),
        reply=last if isinstance(last, str) else "",
        turns=len(replies),
        prompt_length=first,
        reply_start=starts[-1] if starts else first,
        server_moves=list(metadata.get("server_moves") or []),
    )
