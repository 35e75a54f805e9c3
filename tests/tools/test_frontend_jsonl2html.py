"""atroposlib.frontend.jsonl2html: Atropos's report functions over our HTML renderer."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from atroposlib.frontend.jsonl2html import create_html_for_group, generate_html
from atroposlib.utils.html_report import render_groups_html

HOSTILE = '<script>alert("x")</script>'


def test_model_output_is_escaped_in_a_group_and_in_the_page(tmp_path: Path) -> None:
    group = {
        "messages": [[{"role": f"user{HOSTILE}", "content": f"hi {HOSTILE}"}], HOSTILE],
        "scores": [1.0, 0.0],
    }
    block = create_html_for_group(group, 0)
    assert "<script>" not in block
    assert block.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") == 3
    dump = tmp_path / "dump.jsonl"
    dump.write_text(json.dumps(group) + "\n")
    page = generate_html(dump, title=HOSTILE).read_text()
    assert page.count("<script>") == 1, "only the page's own keyboard script"
    assert "&lt;script&gt;alert" in page


def test_a_chat_shows_each_role_and_message() -> None:
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    block = create_html_for_group({"messages": [chat], "scores": [0.25]}, 7)
    for text in ("System:</span> Be brief.", "User:</span> 2+2?", "Assistant:</span> 4"):
        assert text in block
    assert 'id="group-7"' in block and "0.250" in block


def test_messages_beyond_the_scores_are_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="atroposlib.frontend.jsonl2html"):
        block = create_html_for_group({"messages": ["one", "two", "three"], "scores": [0.5]}, 2)
    assert "one" in block and "two" not in block and "three" not in block
    assert "group 2 has 3 messages and 1 scores: showing the first 1" in caplog.text
    assert create_html_for_group({"messages": [], "scores": []}, 0) == ""
    assert create_html_for_group({"messages": ["a"], "scores": []}, 0) == ""


def test_generate_html_writes_the_same_page_as_the_command(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    groups = [{"messages": ["a"], "scores": [1.0]}, {"messages": ["b", "c"], "scores": [0, 1]}]
    dump = tmp_path / "groups.jsonl"
    dump.write_text("\n".join(json.dumps(g) for g in groups) + '\n{"no": "scores"}\n')
    with caplog.at_level(logging.WARNING, logger="atroposlib.frontend.jsonl2html"):
        written = generate_html(str(dump))
    assert written == tmp_path / "groups.html"
    assert written.read_text() == render_groups_html(groups, "groups.jsonl")
    assert f"skipped {dump}:3: not a group" in caplog.text
    out = generate_html(dump, tmp_path / "deeper" / "report.html")
    assert out.is_file()


def test_generate_html_refuses_what_it_cannot_render(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such file"):
        generate_html(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"messages": ["x"]}\n')
    with pytest.raises(ValueError, match="no group to render"):
        generate_html(empty)
    with pytest.raises(ValueError, match="would overwrite the input"):
        generate_html(empty, empty)
