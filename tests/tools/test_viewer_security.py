"""view-run behind the browser guard and, with a key, a login page (a real server, no browser).

The app is served as :func:`launch` serves it (Gradio on 127.0.0.1, ``block=False``) and read
with httpx: what a DNS-rebinding or cross-site page gets, what a local user without the key
gets, and what the page itself gets once logged in. ``reload`` is the app's data event.
"""

from __future__ import annotations

import doctest
import subprocess
import sys
from collections.abc import Callable, Iterator

import httpx
import pytest

from atroposlib.cli import view_run
from atroposlib.utils.health import wait_healthy
from atroposlib.viewer import app as viewer_app
from atroposlib.viewer.app import build_app, launch
from tests.fakes import free_port
from tests.tools.conftest import fixture_groups
from tests.tools.fixture_groups import GROUPS_PATH

pytestmark = pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")  # pandas 3 vs. Gradio

SOURCE = "groups-source-marker"  # shown in the page's config: seen means the page was served
KEY = "viewer-s3cret"
RELOAD = {"data": ["all", "", "", "mask"]}  # env, min score, max score, colour mode


@pytest.fixture
def viewer(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str | None], httpx.Client]]:
    """Serve the fixture groups (with the given key); a client on its loopback URL."""
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    apps, clients = [], []

    def start(key: str | None) -> httpx.Client:
        app = build_app(fixture_groups, None, SOURCE)
        port = free_port()
        launch(app, port, block=False, key=key)
        apps.append(app)
        clients.append(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30))
        return clients[-1]

    yield start
    for client in clients:
        client.close()
    for app in apps:
        app.close(verbose=False)


def test_doctests() -> None:
    failures, tried = doctest.testmod(viewer_app)
    assert tried > 0 and failures == 0


def _reload(client: httpx.Client) -> httpx.Response:
    """Run the app's data event as the page does; the streamed result once it completes."""
    started = client.post("/gradio_api/call/reload", json=RELOAD)
    if started.status_code != 200:
        return started
    return client.get(f"/gradio_api/call/reload/{started.json()['event_id']}")


def _port(client: httpx.Client) -> int:
    return int(client.base_url.port or 0)


@pytest.mark.parametrize("key", [None, KEY])
def test_rebinding_host_and_cross_site_pages_get_403_and_no_data(
    viewer: Callable[[str | None], httpx.Client], key: str | None
) -> None:
    client = viewer(key)
    port = _port(client)
    refused = [
        ({"host": f"evil.example.com:{port}"}, "DNS-rebinding"),
        ({"sec-fetch-site": "cross-site"}, "cross-site request"),
        ({"origin": "http://evil.example.com"}, "cross-site request"),
    ]
    for headers, reason in refused:
        for method, path in [("GET", "/"), ("GET", "/config"), ("POST", "/gradio_api/call/reload")]:
            response = client.request(method, path, headers=headers, json=RELOAD)
            assert response.status_code == 403, (method, path, headers)
            assert reason in response.json()["detail"]
            assert SOURCE not in response.text and "groups from" not in response.text


def test_without_a_key_loopback_and_the_page_itself_are_served(
    viewer: Callable[[str | None], httpx.Client],
) -> None:
    client = viewer(None)
    origin = f"http://127.0.0.1:{_port(client)}"
    page = client.get("/", headers={"sec-fetch-site": "none"})
    assert page.status_code == 200 and SOURCE in page.text
    same_origin = {"origin": origin, "sec-fetch-site": "same-origin"}
    assert client.get("/config", headers=same_origin).status_code == 200
    assert client.get("/config", headers={"host": f"localhost:{_port(client)}"}).status_code == 200
    data = _reload(client)
    assert data.status_code == 200 and f"3 groups from {SOURCE}" in data.text


def test_with_a_key_nothing_is_shown_before_login(
    viewer: Callable[[str | None], httpx.Client],
) -> None:
    client = viewer(KEY)
    page = client.get("/")  # Gradio's login page: a config with no component
    assert page.status_code == 200 and SOURCE not in page.text and "auth_required" in page.text
    for path in ("/config", "/gradio_api/info"):
        response = client.get(path)
        assert response.status_code == 401 and response.json()["detail"]["error"] == (
            "Not authenticated"
        )
    refused = _reload(client)
    assert refused.status_code == 401 and "groups from" not in refused.text
    wrong = client.post("/login", data={"username": "atropos", "password": KEY + "x"})
    assert wrong.status_code == 400 and not client.cookies
    assert client.get("/config").status_code == 401


def test_with_a_key_the_login_opens_the_page_and_the_data(
    viewer: Callable[[str | None], httpx.Client],
) -> None:
    client = viewer(KEY)
    origin = {"origin": f"http://127.0.0.1:{_port(client)}", "sec-fetch-site": "same-origin"}
    login = client.post("/login", data={"username": "anyone", "password": KEY}, headers=origin)
    assert login.status_code == 200 and login.json() == {"success": True}
    assert SOURCE in client.get("/").text
    assert client.get("/config").status_code == 200
    data = _reload(client)
    assert data.status_code == 200 and f"3 groups from {SOURCE}" in data.text


@pytest.mark.parametrize("argv", [["--viewer-key", ""], ["--viewer-key", "  "]])
def test_an_empty_viewer_key_is_a_one_line_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        view_run.main(argv)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--viewer-key" in lines[0] and "empty" in lines[0]
    assert "ATROPOS_VIEW_VIEWER_KEY=" in lines[0] and "ATROPOS_API_KEY" not in lines[0]


def test_the_viewer_key_is_its_own_not_the_run_key(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ATROPOS_VIEW_API_KEY", "ATROPOS_VIEW_VIEWER_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATROPOS_API_KEY", "run-key")
    settings = view_run.parse_command_line(view_run.ViewRunSettings, [], "view-run")
    assert settings.api_key == "run-key" and settings.viewer_key is None
    monkeypatch.setenv("ATROPOS_VIEW_VIEWER_KEY", KEY)
    settings = view_run.parse_command_line(view_run.ViewRunSettings, [], "view-run")
    assert settings.viewer_key == KEY


def _start_cli(env: dict[str, str]) -> tuple[subprocess.Popen[str], httpx.Client]:
    port = free_port()
    command = [sys.executable, "-m", "atroposlib.cli.view_run", "--input", str(GROUPS_PATH)]
    process = subprocess.Popen(
        [*command, "--port", str(port)], env=env, stdout=subprocess.PIPE, text=True
    )
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
    wait_healthy(f"{client.base_url}", timeout_s=90, poll_s=0.3, process=process,
                 name="view-run", client=client)  # fmt: skip
    return process, client


@pytest.mark.slow
@pytest.mark.parametrize("viewer_key", [None, KEY])
def test_view_run_says_whether_a_key_guards_it(
    subprocess_env: dict[str, str], viewer_key: str | None
) -> None:
    env = {**subprocess_env, "ATROPOS_API_KEY": "run-key", "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("ATROPOS_VIEW_VIEWER_KEY", None)
    if viewer_key is not None:
        env["ATROPOS_VIEW_VIEWER_KEY"] = viewer_key
    process, client = _start_cli(env)
    try:
        if viewer_key is None:
            assert client.get("/config").status_code == 200
        else:
            assert client.get("/config").status_code == 401
            run_key = client.post("/login", data={"username": "u", "password": "run-key"})
            assert run_key.status_code == 400
            assert client.post("/login", data={"username": "u", "password": KEY}).is_success
            assert client.get("/config").status_code == 200
    finally:
        client.close()
        process.terminate()
        out, _ = process.communicate(timeout=30)
    said = [line for line in out.splitlines() if "--viewer-key" in line]
    assert len(said) == (1 if viewer_key is None else 0), out
