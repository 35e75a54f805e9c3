"""atropos-sft-gen / atropos-dpo-gen reading JSONL dumps: exact lines, filters, refusals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tools.conftest import ToolRun, expected_lines, read_lines
from tests.tools.fixture_groups import DATA, GROUPS_PATH, build_groups, dump

Run = Callable[..., ToolRun]


def test_fixture_dump_matches_the_tokenizer(tokenizer: object) -> None:
    assert GROUPS_PATH.read_text() == dump(build_groups(tokenizer))


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_exact_lines_from_a_dump(
    kind: str, run_tool: Run, tmp_path: Path, tokenizer_dir: str
) -> None:
    out = tmp_path / "out.jsonl"
    run = run_tool(kind, out, "--input", GROUPS_PATH, "--tokenizer", tokenizer_dir, "--quiet")
    assert run.code == 0, run.stderr
    assert out.read_text() == (DATA / f"expected_{kind}.jsonl").read_text()
    wanted = "wrote 5 lines" if kind == "sft" else "wrote 4 lines"
    assert wanted in run.stderr and "from 3 groups (input exhausted)" in run.stderr


def test_sft_prefix_is_the_masked_prompt_and_completion_the_trained_part() -> None:
    first = expected_lines("sft")[0]
    assert first["prefix"].endswith(
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert first["completion"] == "2 + 3 = 5<|im_end|>"
    assert list(first) == ["prefix", "completion", "score"]


def test_dpo_pairs_best_with_worst() -> None:
    pairs = [(line["pos"], line["neg"], line["score"]) for line in expected_lines("dpo")]
    assert pairs == [
        ("2 + 3 = 5<|im_end|>", "2 + 3 = 6<|im_end|>", 1.0),
        ("5<|im_end|>", "7<|im_end|>", 0.5),
        ("Red<|im_end|>", "Mauve<|im_end|>", 1.0),
        ("Blue<|im_end|>", "Green<|im_end|>", 0.9),
    ]
    assert all(list(line) == ["prefix", "pos", "neg", "score"] for line in expected_lines("dpo"))


@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_existing_output_is_refused_and_untouched(
    kind: str, run_tool: Run, tmp_path: Path, tokenizer_dir: str
) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"keep": true}\n')
    run = run_tool(kind, out, "--input", GROUPS_PATH, "--tokenizer", tokenizer_dir)
    assert run.code == 2
    assert len(run.error_lines) == 1 and "--append-to-previous" in run.error_lines[0]
    assert out.read_text() == '{"keep": true}\n'


def test_append_to_previous_keeps_old_lines(
    run_tool: Run, tmp_path: Path, tokenizer_dir: str
) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"keep": true}\n')
    run = run_tool(
        "sft", out, "--input", GROUPS_PATH, "--tokenizer", tokenizer_dir, "--append-to-previous"
    )
    assert run.code == 0, run.stderr
    assert out.read_text() == '{"keep": true}\n' + (DATA / "expected_sft.jsonl").read_text()


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--group-size", "0"], "--group-size"),
        (["--num-seqs-to-save", "many"], "--num-seqs-to-save"),
        (["--minimum-score-diff-max-min", "-1"], "--minimum-score-diff-max-min"),
        (["--no-such-flag"], "--no-such-flag"),
        (["--reset-broker"], "--reset-broker"),
        (["--dry-run", "--reset-broker"], "--dry-run"),
        (["--tokenizer", "/nonexistent/tokenizer"], "--tokenizer"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], names: str, run_tool: Run, tmp_path: Path, tokenizer_dir: str
) -> None:
    out = tmp_path / "out.jsonl"
    base = ["--input", str(GROUPS_PATH), "--tokenizer", tokenizer_dir]
    run = run_tool("sft", out, *base, *argv)
    assert run.code == 2
    assert len(run.error_lines) == 1 and names in run.error_lines[0], run.stderr
    assert not out.exists()


def test_missing_tokenizer_is_a_flag_error(run_tool: Run, tmp_path: Path) -> None:
    run = run_tool("dpo", tmp_path / "out.jsonl", "--input", GROUPS_PATH)
    assert run.code == 2
    assert len(run.error_lines) == 1 and "--tokenizer is required" in run.error_lines[0]


def _scores_and_completions(path: Path) -> list[tuple[float, str]]:
    return [
        (line["score"], line["completion"].removesuffix("<|im_end|>")) for line in read_lines(path)
    ]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--allow-negative-scores", "--save-top-n-per-group", "2"],
            [
                (1.0, "2 + 3 = 5"),
                (0.5, "5"),
                (1.0, "Red"),
                (0.9, "Blue"),
                (0.0, "hi"),
                (0.0, "hello"),
            ],
        ),
        (["--minimum-score-diff-max-min", "1.5"], [(1.0, "2 + 3 = 5"), (0.5, "5"), (1.0, "Red")]),
        (["--save-top-n-per-group", "1"], [(1.0, "2 + 3 = 5"), (1.0, "Red")]),
        (["--max-token-len", "38"], [(1.0, "Red"), (0.9, "Blue"), (0.2, "Green")]),
        (["--num-seqs-to-save", "3"], [(1.0, "2 + 3 = 5"), (0.5, "5"), (1.0, "Red")]),
    ],
)
def test_sft_filters(
    flags: list[str],
    expected: list[tuple[float, str]],
    run_tool: Run,
    tmp_path: Path,
    tokenizer_dir: str,
) -> None:
    out = tmp_path / "out.jsonl"
    run = run_tool("sft", out, "--input", GROUPS_PATH, "--tokenizer", tokenizer_dir, *flags)
    assert run.code == 0, run.stderr
    assert _scores_and_completions(out) == expected


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--minimum-score-diff-max-min", "0.8"], [("2 + 3 = 5", "2 + 3 = 6"), ("Red", "Mauve")]),
        (["--save-n-pairs-per-group", "1"], [("2 + 3 = 5", "2 + 3 = 6"), ("Red", "Mauve")]),
        (
            ["--minimum-score-diff-max-min", "0", "--allow-negative-scores"],
            [("2 + 3 = 5", "2 + 3 = 6"), ("5", "7"), ("Red", "Mauve"), ("Blue", "Green")],
        ),
        (["--max-token-len", "38"], [("Red", "Green")]),
    ],
)
def test_dpo_pairing_rules(
    flags: list[str],
    expected: list[tuple[str, str]],
    run_tool: Run,
    tmp_path: Path,
    tokenizer_dir: str,
) -> None:
    out = tmp_path / "out.jsonl"
    run = run_tool("dpo", out, "--input", GROUPS_PATH, "--tokenizer", tokenizer_dir, *flags)
    assert run.code == 0, run.stderr
    pairs = [
        (line["pos"].removesuffix("<|im_end|>"), line["neg"].removesuffix("<|im_end|>"))
        for line in read_lines(out)
    ]
    assert pairs == expected


def test_sft_save_messages_needs_no_tokenizer(run_tool: Run, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    run = run_tool(
        "sft", out, "--input", GROUPS_PATH, "--save-messages", "--save-top-n-per-group", "1"
    )
    assert run.code == 0, run.stderr
    assert read_lines(out) == [
        {
            "messages": [
                {"role": "user", "content": "What is 2+3?"},
                {"role": "assistant", "content": "2 + 3 = 5"},
            ],
            "score": 1.0,
        },
        {
            "messages": [
                {"role": "user", "content": "Name a primary colour."},
                {"role": "assistant", "content": "Red"},
            ],
            "score": 1.0,
        },
    ]


def test_dpo_save_messages_splits_the_shared_prompt(run_tool: Run, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    run = run_tool(
        "dpo", out, "--input", GROUPS_PATH, "--save-messages", "--save-n-pairs-per-group", "1"
    )
    assert run.code == 0, run.stderr
    assert read_lines(out)[0] == {
        "prefix": [{"role": "user", "content": "What is 2+3?"}],
        "pos": [{"role": "assistant", "content": "2 + 3 = 5"}],
        "neg": [{"role": "assistant", "content": "2 + 3 = 6"}],
        "score": 1.0,
    }


def test_a_bad_dump_line_names_file_line_and_field(
    run_tool: Run, tmp_path: Path, tokenizer_dir: str
) -> None:
    dump_path = tmp_path / "bad.jsonl"
    good = GROUPS_PATH.read_text().splitlines()[0]
    dump_path.write_text(good + "\n" + '{"tokens": [[1, 2]], "scores": [1.0]}\n')
    out = tmp_path / "out.jsonl"
    run = run_tool("sft", out, "--input", dump_path, "--tokenizer", tokenizer_dir)
    assert run.code == 1
    assert len(run.error_lines) == 1
    assert f"{dump_path}:2: masks" in run.error_lines[0]
    assert not out.exists(), "an empty output left behind would make the retry refuse it"


def test_nothing_passing_the_filters_exits_1(
    run_tool: Run, tmp_path: Path, tokenizer_dir: str
) -> None:
    out = tmp_path / "out.jsonl"
    run = run_tool(
        "sft", out, "--input", GROUPS_PATH, "--tokenizer", tokenizer_dir, "--max-token-len", "10"
    )
    assert run.code == 1
    assert "wrote 0 lines" in run.stderr and "too_long 12" in run.stderr
