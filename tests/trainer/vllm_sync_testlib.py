"""Helpers for the trainer's weight sync against a real vLLM (the ``vllm`` tier): greedy
answers, perturbed weights, pushes through the trainer's own strategies, and replies sampled
token-in through vLLM's ``/inference/v1/generate`` (the route that reports which weight
version sampled each token)."""

from __future__ import annotations

import itertools
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from hold_testlib import EndedFirst, freeze, hold_mid_generation, vllm_counters
from torch import nn

from example_trainer.checkpoint import save_weights
from example_trainer.config import TrainerConfig
from example_trainer.sync_report import SyncReport
from example_trainer.weight_sync import WeightSync, push_weights, sync_for

PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"
_steps = itertools.count(101)


def next_version() -> int:
    """A weight version no earlier push of this test session used (above the trainer's)."""
    return next(_steps)


def story_prompt(model_path: Path) -> list[int]:
    """A chat prompt whose replies run long: the ids vLLM continues from, exactly."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    chat = [{"role": "user", "content": "Tell me a long story about a dragon and a knight."}]
    encoded = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
    return list(encoded["input_ids"])


def load_model(path: Path) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def perturb(model: nn.Module, seed: int, scale: float = 0.02) -> nn.Module:
    """Noise on every parameter (embeddings too: vLLM's LM head is tied to them)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * scale * param.std())
    return model


def greedy(url: str, model: str, n: int = 16) -> list[int]:
    # a fresh cache_salt: in keep mode vLLM may keep prefix-cache blocks of earlier weights
    # (its reset is refused while requests in flight hold blocks); this answer is the weights'
    body = {"model": model, "prompt": PROMPT_IDS, "max_tokens": n, "temperature": 0.0,
            "return_token_ids": True, "cache_salt": uuid.uuid4().hex}  # fmt: skip
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    answer.raise_for_status()
    return list(answer.json()["choices"][0]["token_ids"])


def hf_greedy(model: nn.Module, n: int = 16) -> list[int]:
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([PROMPT_IDS]), max_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return [int(t) for t in out[0, len(PROMPT_IDS) :]]


def version(url: str) -> str:
    return str(httpx.get(f"{url}/weight_info", timeout=30).json()["weight_version"])


def checksums(url: str) -> dict[str, str]:
    answer = httpx.post(f"{url}/weight_checker", json={"action": "checksum"}, timeout=120)
    answer.raise_for_status()
    return {name.rsplit(":", 1)[-1]: digest for name, digest in answer.json()["checksums"].items()}


def live_sync(url: str, transport: str, pause: str, save_dir: Path, retries: int = 0) -> WeightSync:
    cfg = TrainerConfig(
        model="unused", weight_sync="vllm", inference_urls=[url], sync_transport=transport,
        sync_pause=pause, sync_retries=retries, save_dir=save_dir,
    )  # type: ignore[arg-type]  # fmt: skip
    return sync_for(cfg)


def push(sync: WeightSync, model: nn.Module, folder: Path, step: int) -> SyncReport:
    """What the training loop does after a step: the folder is written only if asked for."""
    return push_weights(sync, model, None, folder, lambda: save_weights(model, folder), step)


# ---------------------------------------------------------------------------------------
# Replies in flight
# ---------------------------------------------------------------------------------------


@dataclass
class Reply:
    """One ``/inference/v1/generate`` answer: ids, logprobs, finish reason, version spans."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str
    spans: list[dict[str, Any]] = field(default_factory=list)

    def token_versions(self) -> list[str]:
        return [str(s["version"]) for s in self.spans for _ in range(s["end"] - s["start"])]


def generate(
    client: httpx.Client, url: str, prompt: list[int], max_tokens: int, temperature: float = 1.0
) -> Reply:
    params = {"max_tokens": max_tokens, "temperature": temperature, "ignore_eos": True,
              "logprobs": 0}  # fmt: skip
    body = {"token_ids": prompt, "sampling_params": params}
    answer = client.post(f"{url}/inference/v1/generate", json=body, timeout=600)
    answer.raise_for_status()
    choice = answer.json()["choices"][0]
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = [float(c["logprob"]) for c in content]
    spans = list(choice.get("weight_versions") or [])
    return Reply(list(choice["token_ids"] or []), logprobs, str(choice["finish_reason"]), spans)


class InFlight:
    """``n`` replies of ``tokens`` sampled at once, each in a thread of its own.

    Each thread builds its HTTP client first and all send together (a barrier): built one
    after another on a loaded machine, the first reply could run to its end before the last
    request arrived, and then the six are never mid-generation together (seen once in CI)."""

    def __init__(self, url: str, prompt: list[int], n: int, tokens: int) -> None:
        self.url, self.tokens, self.prompt = url, tokens, prompt
        self.replies: list[Reply | BaseException | None] = [None] * n
        self.ready = threading.Barrier(n)
        self.threads = [threading.Thread(target=self._one, args=(i,), daemon=True)
                        for i in range(n)]  # fmt: skip

    def _one(self, index: int) -> None:
        try:
            with httpx.Client() as client:
                self.ready.wait(timeout=120)
                self.replies[index] = generate(client, self.url, self.prompt, self.tokens)
        except BaseException as error:  # re-raised by finish()
            self.replies[index] = error

    def start(self) -> InFlight:
        for thread in self.threads:
            thread.start()
        return self

    def ended(self) -> str | None:
        """What ended first, if any reply already has: its finish reason or its error."""
        for reply in self.replies:
            if isinstance(reply, BaseException):
                return f"a reply failed: {reply!r}"
            if reply is not None:
                return f"a reply ended ({reply.finish_reason}, {len(reply.ids)} tokens)"
        return None

    def finish(self, timeout: float = 600) -> list[Reply]:
        for thread in self.threads:
            thread.join(timeout)
        out = []
        for reply in self.replies:
            if isinstance(reply, BaseException):
                raise reply
            assert reply is not None, "a reply did not finish"
            out.append(reply)
        return out


def hold_in_flight(url: str, prompt: list[int], n: int, tokens: int, attempts: int = 3) -> InFlight:
    """``n`` replies of ``tokens`` held mid-generation on a frozen vLLM (left frozen).

    A pause the server answers late lets the replies run on; on a loaded CI machine one once
    ran its 160 tokens to the end before the six were held. That batch is then let finish and
    a fresh one sent, up to ``attempts`` times: holding them is the tests' setup, not what
    they check."""
    failures = []
    for _ in range(attempts):
        freeze(url)
        rollouts = InFlight(url, prompt, n, tokens).start()
        try:
            hold_mid_generation(url, n, vllm_counters, rollouts.ended)
            return rollouts
        except EndedFirst as error:
            failures.append(str(error))
            rollouts.finish()  # hold_mid_generation resumed the server: let the rest end
    raise AssertionError(f"{attempts} tries: " + "; ".join(failures))


def served_logprobs(url: str, model: str, prompt: list[int], reply: list[int]) -> np.ndarray:
    """Each reply token's logprob as vLLM's current weights score it, teacher-forced."""
    body = {"model": model, "prompt": prompt + reply, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 1, "cache_salt": uuid.uuid4().hex}  # fmt: skip
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    answer.raise_for_status()
    positions = answer.json()["choices"][0]["prompt_logprobs"][len(prompt) :]
    scored = []
    for token, ranked in zip(reply, positions, strict=True):
        entry = ranked[str(token)]
        scored.append(float(entry["logprob"] if isinstance(entry, dict) else entry))
    return np.asarray(scored)


def scoring_gap(url: str, served_model: str, model: nn.Module) -> float:
    """How far (nats, the largest over 16 tokens) vLLM's scores of its own greedy answer are
    from ``model``'s: ~1e-4 when vLLM serves exactly ``model`` in fp32. Stricter than comparing
    greedy answers, which a half-installed model (a stale LM head, say) can still match."""
    answer = greedy(url, served_model)
    scored = served_logprobs(url, served_model, PROMPT_IDS, answer)
    return float(np.abs(scored - hand_logprobs(model, PROMPT_IDS, answer)).max())


def greedy_margins(model: nn.Module, prompt: list[int], reply: list[int]) -> np.ndarray:
    """At each reply position, how far (nats) the reply's token is below ``model``'s best:
    all zeros when the reply is ``model``'s greedy answer, near zero at a near-tie."""
    ids = torch.tensor([prompt + reply])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)[len(prompt) - 1 :]
    picked = logp.gather(1, ids[0, len(prompt) :, None])[:, 0]
    return (logp.max(dim=-1).values - picked).numpy()


def hand_logprobs(model: nn.Module, prompt: list[int], reply: list[int]) -> np.ndarray:
    """Each reply token's logprob under ``model`` (fp32), given the prompt and the reply so far."""
    ids = torch.tensor([prompt + reply])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
    picked = logp.gather(1, ids[0, 1:, None])[:, 0]
    return picked[len(prompt) - 1 :].numpy()
