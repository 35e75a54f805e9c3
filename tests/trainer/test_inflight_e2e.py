"""In-flight weight sync end to end on CPU: the real small model on the embedded server.

``keep``: the trainer (``weight_sync: embedded``) pushes its step-1 weights while 8 sampled
replies are mid-generation; they finish on the new weights, their groups carry per-token
versions that switch at the update, and at step 2 the trainer's version lags and importance
weights equal the ones computed here by hand; the broker refuses those groups once they are
older than its staleness limit. ``abort``: the same push ends the replies, the sampler
resubmits them token-in, and each final reply is the concatenation of the pieces the engine
sampled (its sample log).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from hold_testlib import embedded_counters, freeze, hold_mid_generation
from trainer_helpers import ListClient, base_args

from atroposlib.api.broker import Broker
from atroposlib.api.settings import BrokerSettings
from atroposlib.api.store import MemoryStore
from atroposlib.envs.rollouts import TokenSampler
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.errors import InvalidGroupError
from atroposlib.group import ScoredData
from atroposlib.inference.sample_log import read_sample_log
from atroposlib.wire.broker import TrainerRegistration
from example_trainer.config import load_config
from example_trainer.train import train

pytestmark = [pytest.mark.slow, pytest.mark.model]

PROMPT = [{"role": "user", "content": "Tell me a long story about a dragon and a knight."}]
IN_FLIGHT = 8
REPLY_TOKENS = 48


class Rollouts:
    """``n`` replies sampled token-in (``TokenSampler``, as envs do) in a thread of their own."""

    def __init__(self, url: str, tokenizer: Any, n: int, max_tokens: int) -> None:
        config = APIServerConfig(
            base_url=f"{url}/v1", model_name="smol", server_type="embedded", api_key="x"
        )
        self.manager = ServerManager([config])
        self.sampler = TokenSampler(
            self.manager, tokenizer, max_tokens=max_tokens, temperature=1.0, ignore_eos=True
        )
        self.n = n
        self.group: ScoredData | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def sample() -> ScoredData:
            replies = await self.sampler.sample(self.sampler.start(PROMPT), n=self.n)
            return self.sampler.group(replies, [float(i % 2) for i in range(self.n)])

        try:
            self.group = asyncio.run(sample())
        except BaseException as error:  # re-raised by finish()
            self.error = error

    def start(self) -> Rollouts:
        self.thread.start()
        return self

    def finish(self, timeout: float = 600) -> ScoredData:
        self.thread.join(timeout)
        if self.error is not None:
            raise self.error
        assert self.group is not None, "the rollouts did not finish"
        return self.group


def versions_of(group: ScoredData) -> list[np.ndarray]:
    assert group.token_policy_versions is not None
    return [np.asarray(row) for row in group.token_policy_versions]


def assert_switch_once(versions: np.ndarray, masks: list[int], to: int) -> None:
    """The sampled tokens' versions go 0...0 then ``to``...``to`` (both parts present)."""
    sampled = versions[np.asarray(masks) != -100]
    assert set(sampled.tolist()) == {0, to}, sampled
    switch = int(np.argmax(sampled == to))
    assert (sampled[:switch] == 0).all() and (sampled[switch:] == to).all()


def hand_logprobs(model_path: Path, group: ScoredData) -> list[np.ndarray]:
    """Every token's logprob under the weights at ``model_path`` (fp32), position-aligned."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for tokens in group.tokens:
            ids = torch.tensor([tokens])
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            picked = logp.gather(1, ids[0, 1:, None])[:, 0]
            out.append(np.concatenate([[0.0], picked.numpy()]))
    return out


def test_keep_mode_updates_weights_under_rollouts_and_the_trainer_sees_their_versions(
    service: Callable[..., str],
    test_model_path: Path,
    tmp_path: Path,
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(test_model_path))
    url = service(
        "atroposlib.inference", "--model", str(test_model_path), "--threads", "1",
        "--max-batch-size", str(IN_FLIGHT),
    )  # fmt: skip
    warmup = Rollouts(url, tokenizer, 2, 8).start().finish()  # step 1 trains on these
    rollouts = Rollouts(url, tokenizer, IN_FLIGHT, REPLY_TOKENS)

    def batches(step: int) -> list[dict[str, Any]]:
        if step == 1:  # the push after this step lands while the rollouts generate
            freeze(url)
            rollouts.start()
            hold_mid_generation(url, IN_FLIGHT, embedded_counters, timeout=120)
            return [warmup.model_dump(mode="json")]
        return [rollouts.finish().model_dump(mode="json")]

    args = base_args(
        test_model_path, tmp_path / "run", "--num-steps", "2", "--save-interval", "1",
        "--max-token-len", "256", "--micro-batch-tokens", "512",
        "--weight-sync", "embedded", "--inference-urls", url, "--sync-pause", "keep",
        "--sync-verify", "checksum", "--sync-chunk-mb", "64",
        "--loss.behavior-logprobs", "inference", "--loss.is-correction", "tis",
        "--loss.is-cap", "2", "--no-loss.mask-zero-variance-groups",
    )  # fmt: skip
    history = train(load_config(args), ListClient(batches))
    group = rollouts.finish()

    # ---- the rollouts finished on the new weights, per-token spans switching at the update
    assert httpx.get(f"{url}/weight_info").json()["weight_version"] == "2"  # after step 2
    assert history[0]["sync/failed"] == 0 and history[0]["sync/pause_seconds"] > 0
    # tensors went in flight, no folder; the final weights are left as one (the checkpoint's)
    weights = tmp_path / "run" / "weights"
    assert [p.name for p in weights.iterdir()] == ["step-2"]
    final = weights / "step-2" / "model.safetensors"
    assert final.stat().st_ino == (tmp_path / "run" / "step-2" / "model.safetensors").stat().st_ino
    versions = versions_of(group)
    assert len(versions) == IN_FLIGHT
    for row, masks in zip(versions, group.masks, strict=True):
        assert_switch_once(row, masks, to=1)
    assert group.policy_versions == [0] * IN_FLIGHT  # each sequence's oldest token
    assert group.finish_reasons == ["length"] * IN_FLIGHT

    # ---- step 2: version lag and importance weights, by hand -----------------------------
    trained = [np.asarray(m) != -100 for m in group.masks]
    lags = np.concatenate([1 - v[t] for v, t in zip(versions, trained, strict=True)])
    row = history[1]
    assert (row["train/version_lag_min"], row["train/version_lag_max"]) == (0.0, 1.0)
    assert row["train/version_lag_mean"] == pytest.approx(float(lags.mean()), abs=1e-6)
    pushed = hand_logprobs(tmp_path / "run" / "step-1", group)  # step 2 trains from these
    assert group.inference_logprobs is not None
    ratios = [
        np.exp(p[t] - np.asarray(inf)[t])
        for p, inf, t in zip(pushed, group.inference_logprobs, trained, strict=True)
    ]
    rows = list(zip(ratios, versions, trained, strict=True))
    by_version = {
        version: np.concatenate([r[v[t] == version] for r, v, t in rows]) for version in (0, 1)
    }
    # keep mode: a token after the swap still attends to keys and values the old weights
    # computed (no recompute_kv), so its ratio is near 1 but not 1; the old tokens are off
    closeness = {v: float(np.median(np.abs(np.log(r)))) for v, r in by_version.items()}
    assert closeness[1] < closeness[0] and closeness[0] > 1e-2, closeness
    hand = float(np.minimum(np.concatenate(ratios), 2.0).mean())  # TIS, is_cap 2
    assert row["train/is_weight"] == pytest.approx(hand, rel=2e-3)

    # ---- the broker: within the staleness limit at step 1, refused past it at step 2 ------
    for limit, step, accepted in ((1, 1, True), (0, 1, False)):
        broker = Broker(MemoryStore(), BrokerSettings(store="memory", stale_policy="reject"))
        registration = {"batch_size": 8, "max_token_len": 256, "starting_step": step,
                        "max_staleness": limit, "wandb_group": "g", "wandb_project": "p",
                        "checkpoint_dir": str(tmp_path), "save_checkpoint_interval": 1,
                        "num_steps": 4}  # fmt: skip
        broker.register_trainer(TrainerRegistration.model_validate(registration))
        if accepted:
            assert broker.ingest([group.model_dump(mode="json")]).accepted == 1
        else:
            with pytest.raises(InvalidGroupError, match="policy_versions"):
                broker.ingest([group.model_dump(mode="json")])


def test_abort_mode_resubmits_replies_and_keeps_every_sampled_piece(
    service: Callable[..., str],
    test_model_path: Path,
    tmp_path: Path,
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from example_trainer.config import TrainerConfig
    from example_trainer.weight_sync import push_weights, sync_for

    tokenizer = AutoTokenizer.from_pretrained(str(test_model_path))
    log = tmp_path / "samples.jsonl"
    url = service(
        "atroposlib.inference", "--model", str(test_model_path), "--threads", "1",
        "--max-batch-size", str(IN_FLIGHT), "--sample-log", str(log),
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(str(test_model_path), dtype=torch.float32)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.01)
    cfg = TrainerConfig(
        model=str(test_model_path), weight_sync="embedded", inference_urls=[url],
        sync_pause="abort", sync_transport="shm", save_dir=tmp_path / "run",
    )  # fmt: skip
    sync = sync_for(cfg)
    freeze(url)
    rollouts = Rollouts(url, tokenizer, IN_FLIGHT, REPLY_TOKENS).start()
    hold_mid_generation(url, IN_FLIGHT, embedded_counters, timeout=120)
    report = push_weights(sync, model, None, tmp_path / "unused", lambda: None, step=1)
    sync.close()
    assert report.ok, report.failed
    group = rollouts.finish()

    prompt = rollouts.sampler.start(PROMPT).tokens
    pieces = read_sample_log(log)
    aborted = [p for p in pieces if p["finish_reason"] == "abort"]
    assert len(aborted) == IN_FLIGHT  # every reply was cut by the update...
    assert len(pieces) == 2 * IN_FLIGHT  # ...and continued once, never sampled again
    assert group.finish_reasons == ["length"] * IN_FLIGHT  # ...and went on to its budget
    for tokens, masks, versions in zip(group.tokens, group.masks, versions_of(group), strict=True):
        reply = tokens[len(prompt) :]
        assert len(reply) == REPLY_TOKENS and all(m != -100 for m in masks[len(prompt) :])
        # a cut piece and the continuation the engine sampled from exactly its ids
        # (several replies may share their first few tokens: any matching pair will do)
        [(cut, rest), *_] = [
            (c["output_ids"], r["output_ids"])
            for c in aborted
            for r in pieces
            if r["prompt_ids"] == [*prompt, *c["output_ids"]]
            and reply == [*c["output_ids"], *r["output_ids"]]
        ]
        assert tokens[: len(prompt)] == prompt
        expected = [0] * len(cut) + [1] * len(rest)
        assert versions[len(prompt) :].tolist() == expected
