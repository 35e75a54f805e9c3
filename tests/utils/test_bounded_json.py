"""``loads_model_output``, the one parser for model-written JSON: nesting is measured before
``json.loads`` runs (so it never recurses deeply), size is bounded, and every way a reply can be
unusable is one ``ModelOutputError`` (a ``ValueError``)."""

from __future__ import annotations

import json
import time

import pytest

from atroposlib.errors import ModelOutputError
from atroposlib.utils.bounded_json import MAX_CHARS, MAX_DEPTH, loads_model_output, nesting_depth

DEEP = 100_000
UNUSABLE = {
    "deep arrays": "[" * DEEP + "]" * DEEP,
    "deep objects": '{"a":' * DEEP + "1" + "}" * DEEP,
    "deep and unclosed": "[" * DEEP,
    "deep after a closed string": '["x\\"y", ' + "[" * DEEP + "]" * DEEP + "]",
    "deep after an escaped backslash": '["\\\\", ' + "[" * DEEP + "]" * DEEP + "]",
    "one level too deep": "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
    "10 MB blob": '{"x": "' + "y" * (10 << 20) + '"}',
    "one character too long": '"' + "y" * (MAX_CHARS - 1) + '"',
    "not JSON": "{name: f}",
    "NaN": '{"x": NaN}',
    "Infinity": "[-Infinity]",
    "an integer of 5000 digits": "9" * 5000,
    "a lone high surrogate": '{"name": "f\\ud800"}',
    "a lone low surrogate as a key": '{"\\udc00": 1}',
    "a raw lone surrogate": '{"name": "f\ud800"}',
    "a control character in a string": '{"x": "a\nb"}',
}
ALLOWED_DEPTH = "[" * MAX_DEPTH + "]" * MAX_DEPTH
USABLE = {
    "a tool call": ('{"name": "f", "args": [1]}', {"name": "f", "args": [1]}),
    "deep nesting inside a string": ('{"x": "' + "[{" * DEEP + '"}', {"x": "[{" * DEEP}),
    "brackets after an escaped quote": ('["a\\"[[[["]', ['a"[[[[']),
    "exactly the deepest allowed": (ALLOWED_DEPTH, json.loads(ALLOWED_DEPTH)),
    "a surrogate pair (an emoji)": ('"\\ud83d\\ude00"', "\U0001f600"),
    "exactly the longest allowed": ('"' + "y" * (MAX_CHARS - 2) + '"', "y" * (MAX_CHARS - 2)),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(UNUSABLE))
def test_unusable_output_is_one_typed_error(name: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ModelOutputError):
        loads_model_output(UNUSABLE[name])
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("name", sorted(USABLE))
def test_usable_output_decodes_as_json_loads_does(name: str) -> None:
    text, expected = USABLE[name]
    assert loads_model_output(text) == expected


def test_the_error_is_a_value_error_and_says_why() -> None:
    with pytest.raises(ValueError, match=f"more than {MAX_DEPTH} levels"):
        loads_model_output(UNUSABLE["deep objects"])
    with pytest.raises(ValueError, match="characters"):
        loads_model_output(UNUSABLE["10 MB blob"])
    with pytest.raises(ValueError, match="surrogate"):
        loads_model_output(UNUSABLE["a lone high surrogate"])


def test_limits_and_strictness_are_the_caller_s() -> None:
    assert loads_model_output("[[1]]", max_depth=2) == [[1]]
    with pytest.raises(ModelOutputError):
        loads_model_output("[[1]]", max_depth=1)
    with pytest.raises(ModelOutputError):
        loads_model_output('"abc"', max_chars=4)
    assert loads_model_output('{"x": "a\nb"}', strict=False) == {"x": "a\nb"}


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("", 0),
        ("[]", 1),
        ('{"a": [1, {"b": 2}]}', 3),
        ('"[[[["', 0),
        ('["\\"[[", [1]]', 2),
        ('["\\\\", [1]]', 2),
        ("[][][]", 1),
        ("]]]][[", 0),
        ('"unclosed [[[[', 0),
    ],
)
def test_nesting_depth_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert nesting_depth(text) == depth


def test_the_depth_scan_stops_early_and_is_linear() -> None:
    assert nesting_depth("[" * DEEP, stop_above=MAX_DEPTH) == MAX_DEPTH + 1
    started = time.perf_counter()
    assert nesting_depth('"' + "\\" * (2 * MAX_CHARS) + '"' + "[]" * MAX_CHARS) == 1
    assert time.perf_counter() - started < 5
