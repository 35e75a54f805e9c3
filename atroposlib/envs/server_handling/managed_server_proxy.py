"""Atropos's import path for the managed-server proxy app; the code lives in atroposlib.proxy.app.

Atropos 0.4 kept the proxy here and bound these names in this module (its tests import
``create_app`` from it; its README runs ``python -m`` on it, which still serves the proxy).
Our own code imports :mod:`atroposlib.proxy` instead.
"""

from atroposlib.envs.server_handling.managed_server import DummyManagedServer, ManagedServer
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atroposlib.proxy.app import ProxySettings, create_app, openai_error
from atroposlib.proxy.cli import main
from atroposlib.proxy.protocol import (
    ChatCompletionProxyRequest,
    ChatMessage,
    RenderResponse,
    SessionCreateRequest,
    SessionCreateResponse,
)
from atroposlib.proxy.session import SessionState

__all__ = [
    "APIServerConfig",
    "ChatCompletionProxyRequest",
    "ChatMessage",
    "DummyManagedServer",
    "ManagedServer",
    "OpenAIServer",
    "ProxySettings",
    "RenderResponse",
    "ServerManager",
    "SessionCreateRequest",
    "SessionCreateResponse",
    "SessionState",
    "ToolCallTranslator",
    "create_app",
    "main",
    "openai_error",
]

if __name__ == "__main__":
    main()
