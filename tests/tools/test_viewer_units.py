"""view-run's pure parts: group HTML, filters, the read-only broker loader."""

from __future__ import annotations

import doctest
from typing import Any

import httpx
import pytest

from atroposlib.viewer import data
from atroposlib.viewer.data import broker_loader, env_ids, filter_groups
from atroposlib.viewer.tokens import group_label, render_group
from tests.tools.conftest import fixture_groups


def test_doctests() -> None:
    failures, tried = doctest.testmod(data)
    assert tried > 0 and failures == 0


def test_render_without_tokenizer_shows_ids_and_orders_by_score() -> None:
    group = fixture_groups()[1]
    page = render_group(group, None, "mask", "title <x>")
    assert "title &lt;x&gt;" in page
    heads = [part.split("</div>")[0] for part in page.split('class="atv-head">')[3:]]
    assert heads[0].startswith("Completion 1 · sequence 0 · score 1")
    assert heads[-1].startswith("Completion 4 · sequence 3 · score -0.5")
    assert f"⟨{group['tokens'][0][-1]}⟩" in page


def test_without_tokenizer_messages_give_readable_text() -> None:
    page = render_group(fixture_groups()[0], None, "mask")
    assert "user: What is 2+3?" in page and "assistant: 2 + 3 = 5" in page
    bare = render_group({**fixture_groups()[0], "messages": None}, None, "mask")
    assert "What is 2+3?" not in bare and "⟨1⟩" in bare


def test_missing_signal_is_said_not_guessed() -> None:
    group = {**fixture_groups()[0], "advantages": None}
    page = render_group(group, None, "advantage")
    assert "this group has no advantages" in page


def test_tokens_are_escaped(tokenizer: Any) -> None:
    ids = tokenizer("<b>x</b>", add_special_tokens=False)["input_ids"]
    group = {"tokens": [[1, *ids]], "masks": [[-100, *ids]], "scores": [1.0]}
    page = render_group(group, tokenizer, "mask")
    assert "<b>" not in page and "&lt;" in page


def test_filters_and_labels() -> None:
    groups = fixture_groups()
    assert env_ids(groups) == [0, 1]
    assert filter_groups(groups, env_id=1) == [1]
    assert filter_groups(groups, min_score=0.95) == [0, 1]
    assert filter_groups(groups, max_score=-0.75) == [0]
    assert filter_groups(groups, env_id=0, min_score=0.1, max_score=0.6) == [0]
    assert group_label(2, groups[2]) == "#2 · env 0 · 4 seqs · best 0 · mean 0"


def test_broker_loader_only_reads_recent_groups() -> None:
    calls: list[tuple[str, dict[str, Any], dict[str, str]]] = []

    def fake_get(url: str, *, params: dict[str, Any], headers: dict[str, str], **_: Any) -> Any:
        calls.append((url, params, headers))
        request = httpx.Request("GET", url)
        return httpx.Response(200, json={"groups": fixture_groups()[:1]}, request=request)

    load = broker_loader("http://b:8000/", "secret", limit=5, http_get=fake_get)
    assert [group["scores"] for group in load()] == [[1.0, -1.0, 0.5, 0.0]]
    ((url, params, headers),) = calls
    assert url == "http://b:8000/recent_groups" and params == {"limit": 5}
    assert headers["Authorization"] == "Bearer secret"


def test_broker_loader_surfaces_http_errors() -> None:
    def fake_get(url: str, **_: Any) -> Any:
        return httpx.Response(401, json={"detail": "bad token"}, request=httpx.Request("GET", url))

    with pytest.raises(httpx.HTTPStatusError):
        broker_loader("http://b:8000", http_get=fake_get)()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--port", "70000"], "--port"),
        (["--input", "/nonexistent.jsonl"], "/nonexistent.jsonl"),
        (["--tokenizer", "/nonexistent/tok"], "--tokenizer"),
        (["--share"], "--share"),
        (["--limit", "0"], "--limit"),
    ],
)
def test_view_run_bad_flags_exit_2_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from atroposlib.cli import view_run

    with pytest.raises(SystemExit) as stop:
        view_run.main(argv)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]
