"""The generated Atropos 0.4 compatibility report is current: a public name of atroposlib
0.4.0 that disappears from ours (or a new one we add) changes the report and fails here."""

from __future__ import annotations

import json

from scripts import atropos_compat_report as report


def test_the_checked_in_report_is_what_ours_gives_now() -> None:
    assert report.main(["check"]) == 0, "run: python scripts/atropos_compat_report.py render"


def test_every_name_atropos_env_files_import_is_provided() -> None:
    manifest = json.loads(report.MANIFEST.read_text())
    rows = {(r["module"], r["name"]): r for r in report.evaluate(manifest)}
    imported_by_env_files = [
        ("atroposlib.envs.base", "BaseEnv"), ("atroposlib.envs.base", "APIServerConfig"),
        ("atroposlib.envs.base", "ScoredDataItem"), ("atroposlib.envs.reward_fns", "registry"),
        ("atroposlib.envs.reward_fns", "RewardFunction"),
        ("atroposlib.envs.reward_fns.combined_reward", "CombinedReward"),
        ("atroposlib.envs.server_handling.managed_server", "ManagedServerAdapter"),
        ("atroposlib.envs.server_handling.openai_server", "APIServerConfig"),
        ("atroposlib.envs.eval", "EvalBase"), ("atroposlib.utils.io", "parse_http_response"),
        ("atroposlib.utils.tool_call_parser", "parse_tool_call"),
        ("atroposlib.utils.message_history_utils", "truncate_thinking"),
        ("atroposlib.utils.best_of_n_selection", "select_best_index"),
        ("atroposlib.envs.teacher_distillation_env", "TeacherDistillationEnv"),
    ]  # fmt: skip
    assert all(rows[key]["ours"] for key in imported_by_env_files)
    assert rows[("atroposlib.envs.server_handling.server_manager", "ServerManager")]["ours"]
