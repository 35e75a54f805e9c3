"""view-run in a real headless browser (Debian's chromium driven by Playwright).

The app runs as users run it (``python -m atroposlib.cli.view_run``, a separate process); the
test loads the page, picks a group, checks the text and colours shown, and saves screenshots
under ``test-artifacts/``. Needs ``scripts/install-browser`` (CI runs it); never skipped.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from atroposlib.utils.health import wait_healthy
from tests.fakes import free_port
from tests.tools.conftest import LiveBroker, fixture_groups, without_env_ids
from tests.tools.fixture_groups import GROUPS_PATH

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "chromium missing: run scripts/install-browser"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@dataclass
class ViewRun:
    url: str
    process: subprocess.Popen[bytes]

    def listening_addresses(self) -> set[str]:
        connections = psutil.Process(self.process.pid).net_connections(kind="inet")
        return {c.laddr.ip for c in connections if c.status == psutil.CONN_LISTEN}


@pytest.fixture
def view_run(subprocess_env: dict[str, str]) -> Iterator[Callable[..., ViewRun]]:
    """Start ``view-run`` with the given flags; returns it once its page answers."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> ViewRun:
        port = free_port()
        command = [sys.executable, "-m", "atroposlib.cli.view_run", "--port", str(port), *flags]
        process = subprocess.Popen(command, env=subprocess_env)
        started.append(process)
        url = f"http://127.0.0.1:{port}/"
        wait_healthy(url, timeout_s=180, poll_s=0.5, process=process, name="view-run")
        return ViewRun(url, process)

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _open(browser: Browser, url: str) -> Page:
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("#group-view .atv-seq", timeout=60_000)
    return page


def _pick(page: Page, dropdown: str, option: str) -> None:
    page.locator(f"#{dropdown} input").click()
    page.get_by_role("option", name=option).click()
    page.keyboard.press("Escape")


def _screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    return path


def test_browse_a_dump_pick_a_group_colour_by_advantage(
    browser: Browser, view_run: Callable[..., ViewRun], tokenizer_dir: str
) -> None:
    app = view_run("--input", str(GROUPS_PATH), "--tokenizer", tokenizer_dir)
    assert app.listening_addresses() == {"127.0.0.1"}
    page = _open(browser, app.url)
    expect(page.locator("#status")).to_contain_text("3 groups from")
    view = page.locator("#group-view")
    expect(view).to_contain_text("What is 2+3?")

    _pick(page, "group", "#1 · env 1 · 4 seqs · best 1 · mean 0.4")
    expect(view).to_contain_text("Name a primary colour.")
    completions = view.locator(".atv-seq .atv-head").all_inner_texts()
    assert completions == [
        "Completion 1 · sequence 0 · score 1",
        "Completion 2 · sequence 1 · score 0.9",
        "Completion 3 · sequence 2 · score 0.2",
        "Completion 4 · sequence 3 · score -0.5",
    ]
    assert view.locator(".atv-tokens").all_inner_texts() == [
        "Red<|im_end|>", "Blue<|im_end|>", "Green<|im_end|>", "Mauve<|im_end|>",
    ]  # fmt: skip
    trained = view.locator(".atv-seq").first.locator(".atv-tok").first
    assert "rgb(220, 252, 231)" in trained.evaluate("e => getComputedStyle(e).backgroundColor")
    assert "trained" in (trained.get_attribute("title") or "")

    page.get_by_label("advantage").check()
    red = view.locator(".atv-seq").first.locator(".atv-tok").first
    expect(red).to_have_attribute("style", re.compile(r"rgba\(59, 130, 246, 0\.500"))  # +0.6 of 0.9
    expect(red).to_have_attribute("title", "id 12869 · trained · logprob 0.000 · advantage 0.600")
    mauve = view.locator(".atv-seq").nth(3).locator(".atv-tok").first
    expect(mauve).to_have_attribute("style", re.compile(r"rgba\(239, 68, 68, 0\.750"))  # -0.9

    page.get_by_label("logprob").check()
    first_seq = view.locator(".atv-seq").first
    expect(first_seq.locator(".atv-tok").first).to_have_attribute(
        "style", re.compile(r"rgba\(239, 68, 68, 0\.000")
    )  # logprob 0: probability 1, not red
    end_token = first_seq.locator(".atv-tok").nth(1)
    expect(end_token).to_have_attribute(
        "title", "id 2 · trained · logprob -0.250 · advantage 0.600"
    )
    expect(end_token).to_have_attribute("style", re.compile(r"rgba\(239, 68, 68, 0\.18"))
    _screenshot(page, "view-run-dump.png")

    _pick(page, "env", "0")
    expect(view).to_contain_text("What is 2+3?")  # the filter's answer has arrived
    page.locator("#group input").click()
    expect(page.get_by_role("option")).to_have_count(2)
    options = page.get_by_role("option").all_inner_texts()
    assert [option.strip("✓\n ") for option in options] == [
        "#0 · env 0 · 4 seqs · best 1 · mean 0.125",
        "#2 · env 0 · 4 seqs · best 0 · mean 0",
    ]
    page.keyboard.press("Escape")
    page.locator("#min-score textarea, #min-score input").first.fill("0.5")
    page.locator("#min-score textarea, #min-score input").first.press("Enter")
    page.locator("#group input").click()
    expect(page.get_by_role("option")).to_have_count(1)
    expect(page.get_by_role("option")).to_contain_text("#0 · env 0")
    page.close()


def test_browse_a_live_broker_read_only(
    browser: Browser,
    view_run: Callable[..., ViewRun],
    live_broker: LiveBroker,
    tokenizer_dir: str,
) -> None:
    live_broker.post("/scored_data_list", without_env_ids(fixture_groups()))
    before = live_broker.get("/status")
    app = view_run("--api-url", live_broker.url, "--tokenizer", tokenizer_dir, "--limit", "2")
    page = _open(browser, app.url)
    expect(page.locator("#status")).to_contain_text(f"2 groups from broker {live_broker.url}")
    view = page.locator("#group-view")
    expect(view).to_contain_text("Name a primary colour.")
    _pick(page, "group", "#1 · env - · 4 seqs · best 0 · mean 0")
    expect(view).to_contain_text("Say hi.")
    page.get_by_role("button", name="Reload").click()
    expect(page.locator("#status")).to_contain_text("2 groups from broker")
    _screenshot(page, "view-run-broker.png")
    page.close()
    # Read-only: nothing consumed, no trainer registered, nothing reset.
    assert live_broker.get("/status") == before == {"current_step": 0, "queue_size": 3}
    assert live_broker.get("/info") == {"batch_size": -1, "max_token_len": -1}
