"""One guard for every server of ours (broker, inference server, proxy): bearer keys, the
browser (cross-site / DNS-rebinding) guard and the access settings they all declare."""

from atroposlib.security.access import AccessSettings, mount_guard, warn_if_open
from atroposlib.security.guard import BrowserGuard, BrowserGuardMiddleware, is_loopback
from atroposlib.security.keys import (
    ADMIN_DETAIL,
    ADMIN_KEY_VARIABLE,
    KEY_VARIABLE,
    UNAUTHORIZED_DETAIL,
    UNAUTHORIZED_HEADERS,
    bearer_header_ok,
    bearer_matches,
    new_key,
    require_bearer,
)

__all__ = [
    "ADMIN_DETAIL",
    "ADMIN_KEY_VARIABLE",
    "KEY_VARIABLE",
    "UNAUTHORIZED_DETAIL",
    "UNAUTHORIZED_HEADERS",
    "AccessSettings",
    "BrowserGuard",
    "BrowserGuardMiddleware",
    "bearer_header_ok",
    "bearer_matches",
    "is_loopback",
    "mount_guard",
    "new_key",
    "require_bearer",
    "warn_if_open",
]
