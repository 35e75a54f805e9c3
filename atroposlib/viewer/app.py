"""The ``view-run`` Gradio app: pick a group, read its prompt and coloured completions.

Built from a loader (broker or files) and a decoder; nothing global. :func:`launch` binds
127.0.0.1 only, never creates a public share link, mounts the browser guard of every server of
ours (a DNS-rebinding or cross-site page gets 403) and, given a key, asks for it on a login
page (a browser cannot send a bearer header, so the key is the password and the session a
cookie). Gradio adds its own CORS and compression layers outside the guard: a CORS preflight
(``OPTIONS``) is answered there, with no data, before the guard sees it.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

import gradio as gr
import httpx
from pydantic import ValidationError
from starlette.middleware import Middleware

from atroposlib.export.groups import GroupFileError
from atroposlib.export.text import Decoder
from atroposlib.security import AccessSettings, BrowserGuard, BrowserGuardMiddleware
from atroposlib.viewer.data import GroupLoader, env_ids, filter_groups
from atroposlib.viewer.tokens import COLOUR_MODES, VIEW_CSS, ColourBy, group_label, render_group

logger = logging.getLogger(__name__)

ALL_ENVS = "all"
LOCALHOST = "127.0.0.1"
LOGIN_MESSAGE = "Any user name; the password is the viewer key (--viewer-key)."
_EMPTY = '<div class="atv-note">no group matches the filters</div>'


def _number(text: Any) -> float | None:
    """A score bound typed by the user; blank or not a number means no bound."""
    try:
        return float(text) if text is not None and str(text).strip() else None
    except ValueError:
        return None


def build_app(load: GroupLoader, decoder: Decoder | None, source: str) -> gr.Blocks:
    def show(groups: list[dict[str, Any]], index: Any, mode: ColourBy) -> str:
        if index is None or not groups or int(index) >= len(groups):
            return _EMPTY
        chosen = int(index)
        return render_group(groups[chosen], decoder, mode, group_label(chosen, groups[chosen]))

    def pick(
        groups: list[dict[str, Any]], env: str, low: Any, high: Any, mode: ColourBy
    ) -> tuple[Any, str]:
        env_id = None if env in (None, ALL_ENVS) else int(env)
        matches = filter_groups(groups, env_id, _number(low), _number(high))
        choices = [(group_label(index, groups[index]), str(index)) for index in matches]
        first = str(matches[0]) if matches else None
        return gr.update(choices=choices, value=first), show(groups, first, mode)

    def reload(
        env: str, low: Any, high: Any, mode: ColourBy
    ) -> tuple[list[dict[str, Any]], Any, Any, str, str]:
        try:
            groups = load()
            status = f"{len(groups)} groups from {source}"
        except (httpx.HTTPError, GroupFileError, ValidationError, OSError) as err:
            logger.exception("loading groups from %s failed", source)
            groups, status = [], f"could not load groups from {source}: {err}"
        envs = [ALL_ENVS, *(str(env_id) for env_id in env_ids(groups))]
        env = env if env in envs else ALL_ENVS
        picker, view = pick(groups, env, low, high, mode)
        return groups, gr.update(choices=envs, value=env), picker, view, status

    with gr.Blocks(title="view-run · atroposlib", analytics_enabled=False) as app:
        groups_state = gr.State([])
        gr.Markdown(f"### view-run · {source}")
        status = gr.Markdown(elem_id="status")
        with gr.Row():
            env = gr.Dropdown([ALL_ENVS], value=ALL_ENVS, label="Env", elem_id="env")
            low = gr.Textbox("", label="Min score", placeholder="any", elem_id="min-score")
            high = gr.Textbox("", label="Max score", placeholder="any", elem_id="max-score")
            mode = gr.Radio(list(COLOUR_MODES), value="mask", label="Colour tokens by")
            refresh = gr.Button("Reload", elem_id="reload")
        picker = gr.Dropdown([], label="Group", elem_id="group", interactive=True)
        view = gr.HTML(_EMPTY, elem_id="group-view")

        loaded = [groups_state, env, picker, view, status]
        app.load(reload, [env, low, high, mode], loaded)
        refresh.click(reload, [env, low, high, mode], loaded)
        for control in (env, low, high):
            control.change(pick, [groups_state, env, low, high, mode], [picker, view])
        picker.change(show, [groups_state, picker, mode], view)
        mode.change(show, [groups_state, picker, mode], view)
    return app


def key_check(key: str) -> Callable[[str, str], bool]:
    """Gradio's login check: the password is ``key`` (compared in constant time), any user name.

    >>> check = key_check("s3cret")
    >>> check("me", "s3cret"), check("atropos", "s3cret "), check("me", "")
    (True, False, False)
    """
    expected = key.encode()

    def check(_user: str, password: str) -> bool:
        return secrets.compare_digest(password.encode(), expected)

    return check


def guard_middleware() -> Middleware:
    """The browser guard of a loopback server without a bearer key: the viewer's session is a
    cookie a browser sends on any site's behalf, so the guard stays on with a key too."""
    return Middleware(BrowserGuardMiddleware, guard=BrowserGuard(AccessSettings(host=LOCALHOST)))


def launch(app: gr.Blocks, port: int, *, block: bool = True, key: str | None = None) -> None:
    """Serve on 127.0.0.1:``port`` behind the browser guard, asking for ``key`` when given; no
    share link, no analytics, no server-side rendering."""
    app.launch(
        server_name=LOCALHOST,
        server_port=port,
        share=False,
        prevent_thread_lock=not block,
        ssr_mode=False,
        quiet=True,
        css=VIEW_CSS,
        theme=gr.themes.Default(font=["ui-sans-serif", "system-ui", "sans-serif"]),
        auth=None if key is None else key_check(key),
        auth_message=LOGIN_MESSAGE,
        app_kwargs={"middleware": [guard_middleware()]},
    )
