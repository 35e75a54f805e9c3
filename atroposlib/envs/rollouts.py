"""Token-in/token-out sampling for environments, and the scored group made from it.

Every catalogue environment samples through :class:`TokenSampler` (``BaseEnv.token_sampler()``
makes one on the env's servers and tokenizer):

    sampler = self.token_sampler(max_tokens=256, temperature=1.0)
    replies = await sampler.sample(sampler.start(prompt_messages), n=self.config.group_size)
    scores = my_reward([reply.reply for reply in replies])
    return sampler.group(replies, scores), []

A multi-turn env keeps one :class:`~atroposlib.envs.trajectory.Trajectory` per episode and
alternates ``sampler.sample(trajectory)`` with ``sampler.add_messages(trajectory, [...])``; each
request sends the trajectory's exact ids. Completion ids and logprobs come from the server's
token fields (``/generate`` output ids on SGLang and the embedded server; ``token_ids`` /
``logprobs`` on vLLM). A server that returns no ids (``server_type: openai``) falls back to
re-tokenizing the reply text: logged once, and its groups carry no ``inference_logprobs``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

from pydantic import BaseModel

from atroposlib.envs.server_handling.server_baseline import GeneratedSequence
from atroposlib.envs.trajectory import ChatTemplate, Trajectory, finish_reason
from atroposlib.errors import ContextFullError, InferenceError
from atroposlib.group import MASK_IGNORE_INDEX, GroupOverrides, ScoredData, SequenceOverrides
from atroposlib.type_definitions import Message

logger = logging.getLogger(__name__)

MAX_RESUBMISSIONS = 100
"""Aborts of one reply in a row before sampling gives up (a server never resumed)."""

ScoreReplies = Callable[[list[str]], Sequence[float] | Awaitable[Sequence[float]]]
"""Scores for a list of replies, one each, in order (a plain or an async function)."""

_warned_text_fallback = False


class TokenServer(Protocol):
    """What sampling needs of a server: ``ServerManager`` fits."""

    @property
    def returns_token_ids(self) -> bool: ...

    async def generate(
        self, input_ids: list[int], n: int, sampling: dict[str, Any]
    ) -> list[GeneratedSequence]: ...

    async def chat_completion(self, **kwargs: Any) -> Any: ...


class TokenSampler:
    """Samples replies token-in/token-out and turns trajectories into a ``ScoredData``."""

    def __init__(
        self,
        server: TokenServer,
        tokenizer: Any,
        *,
        max_tokens: int,
        temperature: float = 1.0,
        max_token_length: int | None = None,
        **sampling: Any,
    ) -> None:
        self.server = server
        self.template = ChatTemplate(tokenizer)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_token_length = max_token_length
        self.sampling = sampling

    @property
    def generation_params(self) -> dict[str, Any]:
        """What the trainer needs to recompute the sampling logprobs (temperature, ...)."""
        sampling = {k: v for k, v in self.sampling.items() if k != "split"}
        return {"temperature": self.temperature, "max_tokens": self.max_tokens, **sampling}

    def start(self, messages: Sequence[Message]) -> Trajectory:
        """A trajectory holding the prompt: the chat template applied once."""
        return Trajectory.start(self.template.prompt_ids(messages), messages)

    def add_messages(self, trajectory: Trajectory, messages: Sequence[Message]) -> Trajectory:
        """``trajectory`` followed by env/tool ``messages`` (their template delta, untrained)."""
        last = trajectory.tokens[-1] if trajectory.tokens else None
        sampled_stop = (
            last
            if last in self.template.special_ids and trajectory.masks[-1] != MASK_IGNORE_INDEX
            else None
        )
        ids = self.template.continuation_ids(trajectory.messages, messages, sampled_stop)
        return trajectory.with_context(ids, messages)

    async def sample(self, trajectory: Trajectory, n: int = 1, **sampling: Any) -> list[Trajectory]:
        """``n`` continuations of ``trajectory``, each sent as its exact id prefix.

        A reply the engine aborts (a weight update paused it in ``abort`` mode) is resubmitted
        token-in, the prompt and the reply's ids so far with the rest of its token budget,
        until it finishes: no sampled token is thrown away or sampled again, and each keeps the
        weight version that sampled it. A trajectory whose last reply was aborted is continued
        the same way.
        With ``max_token_length`` set, each piece is capped to the room left; ContextFullError
        when there is none to start with.
        """
        if "temperature" in sampling:
            raise ValueError(
                "the temperature is the sampler's (the group reports it to the trainer); "
                "make a TokenSampler per temperature"
            )
        params = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            **self.sampling,
            **sampling,
        }
        if self.max_token_length is not None and len(trajectory.tokens) >= self.max_token_length:
            raise ContextFullError(
                f"the trajectory has {len(trajectory.tokens)} tokens, "
                f"max_token_length is {self.max_token_length}"
            )
        budget = int(params["max_tokens"])
        first = {**params, "max_tokens": self._piece_budget(trajectory, budget)}
        if not self.server.returns_token_ids:
            return await self._sample_text(trajectory, n, first)
        replies = await self._sample_ids(trajectory, n, first)
        return list(await asyncio.gather(*(self._until_finished(r, params) for r in replies)))

    async def _sample_ids(
        self, trajectory: Trajectory, n: int, params: dict[str, Any]
    ) -> list[Trajectory]:
        samples = await self.server.generate(list(trajectory.tokens), n, params)
        before = trajectory.reply_ids if trajectory.finish_reason == "abort" else []
        replies = []
        for s in samples:
            reply = trajectory.with_sample(
                s.output_ids,
                s.logprobs,
                s.weight_version,
                finish_reason(s.finish_reason),
                self.template.text([*before, *s.output_ids]),
                s.token_versions,
            )
            if s.versions_unknown:
                reply = replace(reply, versions_unknown=s.versions_unknown)
            replies.append(reply)
        return replies

    async def _until_finished(self, trajectory: Trajectory, params: dict[str, Any]) -> Trajectory:
        """Resubmit an aborted reply with the budget it has left until it ends."""
        budget = int(params["max_tokens"])
        for _ in range(MAX_RESUBMISSIONS):
            if trajectory.finish_reason != "abort":
                return trajectory
            left = self._piece_budget(trajectory, budget)
            if left <= 0:
                return replace(trajectory, finish_reason="length")
            [trajectory] = await self._sample_ids(trajectory, 1, {**params, "max_tokens": left})
        raise InferenceError(
            f"a reply was aborted {MAX_RESUBMISSIONS} times in a row; is the inference server "
            "being paused in abort mode without ever being resumed?"
        )

    def _piece_budget(self, trajectory: Trajectory, budget: int) -> int:
        """Tokens the reply's next piece may sample: what its budget has left (an aborted
        reply's ids so far count), capped to the room ``max_token_length`` leaves."""
        left = budget - _open_reply_length(trajectory)
        if self.max_token_length is None:
            return left
        return min(left, self.max_token_length - len(trajectory.tokens))

    async def _sample_text(
        self, trajectory: Trajectory, n: int, params: dict[str, Any]
    ) -> list[Trajectory]:
        global _warned_text_fallback
        if not _warned_text_fallback:
            _warned_text_fallback = True
            logger.warning(
                "the inference servers return no token ids (server_type openai): replies are "
                "re-tokenized from text and groups carry no inference_logprobs; use "
                "server_type vllm, sglang or embedded for token-exact training"
            )
        completion = await self.server.chat_completion(
            messages=list(trajectory.messages), n=n, **params
        )
        tokenizer = self.template.tokenizer
        out = []
        for choice in completion.choices:
            text = choice.message.content or ""
            reason = finish_reason(choice.finish_reason)
            ids = list(tokenizer.encode(text, add_special_tokens=False))
            if reason == "stop" and tokenizer.eos_token_id is not None:
                ids.append(int(tokenizer.eos_token_id))
            out.append(trajectory.with_sample(ids, None, None, reason, text))
        return out

    def group(
        self,
        trajectories: Sequence[Trajectory],
        scores: Sequence[float],
        *,
        overrides: Sequence[SequenceOverrides | Mapping[str, Any]] | None = None,
        group_overrides: GroupOverrides | Mapping[str, Any] | None = None,
        extra: Sequence[BaseModel | Mapping[str, Any]] | None = None,
    ) -> ScoredData:
        """The scored group of ``trajectories`` (one score each), as they were sampled."""
        return trajectory_group(
            trajectories,
            scores,
            generation_params=self.generation_params,
            overrides=overrides,
            group_overrides=group_overrides,
            extra=extra,
        )


def trajectory_group(
    trajectories: Sequence[Trajectory],
    scores: Sequence[float],
    *,
    generation_params: Mapping[str, Any] | None = None,
    overrides: Sequence[SequenceOverrides | Mapping[str, Any]] | None = None,
    group_overrides: GroupOverrides | Mapping[str, Any] | None = None,
    extra: Sequence[BaseModel | Mapping[str, Any]] | None = None,
) -> ScoredData:
    """Stack trajectories into one group: ids, masks, inference logprobs, versions, reasons."""
    if len(trajectories) != len(scores):
        raise ValueError(f"{len(trajectories)} trajectories but {len(scores)} scores")
    exact = all(t.exact for t in trajectories)
    versions = [t.oldest_version for t in trajectories]
    known = any(v is not None for v in versions)
    return ScoredData.model_validate(
        {
            "tokens": [t.tokens for t in trajectories],
            "masks": [t.masks for t in trajectories],
            "scores": [float(s) for s in scores],
            "inference_logprobs": [t.logprobs for t in trajectories] if exact else None,
            "token_policy_versions": [t.versions for t in trajectories] if known else None,
            "policy_versions": versions if known else None,
            "finish_reasons": [t.finish_reason for t in trajectories],
            "messages": [t.messages for t in trajectories],
            "generation_params": dict(generation_params) if generation_params else None,
            "overrides": [_plain(o) for o in overrides] if overrides is not None else None,
            "group_overrides": _plain(group_overrides) if group_overrides is not None else None,
            "extra": _extra_with_notes(trajectories, extra),
        }
    )


def _extra_with_notes(
    trajectories: Sequence[Trajectory], extra: Sequence[BaseModel | Mapping[str, Any]] | None
) -> list[dict[str, Any]] | None:
    """``extra`` as plain dicts, each with its trajectory's ``server_moves`` where it moved and
    ``versions_unknown`` where the engine reported no weight versions (and why)."""
    if not any(t.server_moves or t.versions_unknown for t in trajectories):
        return [_plain(e) for e in extra] if extra is not None else None
    given = [_plain(e) for e in extra] if extra is not None else [{} for _ in trajectories]
    noted = []
    for entry, t in zip(given, trajectories, strict=True):
        if t.server_moves:
            entry = {**entry, "server_moves": t.server_moves}
        if t.versions_unknown:
            entry = {**entry, "versions_unknown": t.versions_unknown}
        noted.append(entry)
    return noted


def _open_reply_length(trajectory: Trajectory) -> int:
    """Ids of the reply still open (aborted), which count against its token budget."""
    return len(trajectory.reply_ids) if trajectory.finish_reason == "abort" else 0


def _plain(value: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    return dict(value)


async def sample_group(
    server: TokenServer,
    tokenizer: Any,
    prompt: Sequence[Message],
    score: ScoreReplies,
    *,
    n: int,
    max_tokens: int,
    temperature: float = 1.0,
    screen: int = 0,
    settled_logprob: float | None = None,
) -> ScoredData:
    """Sample ``n`` replies to ``prompt`` token-in/token-out, score their text, group them.

    ``screen`` (0 < screen < n): sample that many replies first; when their scores are all
    equal (and, with ``settled_logprob``, each of them is a reply the engine sampled with a
    total logprob of at least that: one the others would almost surely repeat), stop there and
    return them as a group of ``screen`` (``group_overrides``: ``group_size`` and ``screened``)
    for the env to drop as all-equal; else sample the rest. Only for an env that drops
    all-equal groups, and a ``score`` that scores each reply on its own (it is called on the
    first replies, then on the rest).
    """
    if not 0 <= screen < n:
        raise ValueError(f"screen {screen} with n {n}: give 0 (off) or fewer replies than n")
    sampler = TokenSampler(server, tokenizer, max_tokens=max_tokens, temperature=temperature)
    start = sampler.start(prompt)
    replies = await sampler.sample(start, n=screen or n)
    scores = await _scored(score, replies)
    if screen:
        if len(set(scores)) == 1 and all(_settled(r, settled_logprob) for r in replies):
            stopped = {"group_size": screen, "screened": True}
            return sampler.group(replies, scores, group_overrides=stopped)
        rest = await sampler.sample(start, n=n - screen)
        replies, scores = replies + rest, scores + await _scored(score, rest)
    return sampler.group(replies, scores)


def reply_logprob(trajectory: Trajectory) -> float | None:
    """The total logprob the engine gave the last reply's sampled ids (None: the ids were
    re-tokenized from text, so there are none)."""
    if not trajectory.exact:
        return None
    sampled = range(trajectory.reply_start, len(trajectory.tokens))
    return sum(trajectory.logprobs[i] for i in sampled if trajectory.masks[i] != MASK_IGNORE_INDEX)


def _settled(reply: Trajectory, settled_logprob: float | None) -> bool:
    if settled_logprob is None:
        return True
    logprob = reply_logprob(reply)
    return logprob is not None and logprob >= settled_logprob


async def _scored(score: ScoreReplies, replies: Sequence[Trajectory]) -> list[float]:
    scores = score([reply.reply for reply in replies])
    if inspect.isawaitable(scores):
        scores = await scores
    return list(scores)


async def greedy_reply(server: Any, prompt: Sequence[Message], *, max_tokens: int) -> str:
    """One greedy (``temperature=0``) reply for evaluation, on the server's eval capacity."""
    completion = await server.chat_completion(
        messages=list(prompt), n=1, max_tokens=max_tokens, temperature=0.0, split="eval"
    )
    return str(completion.choices[0].message.content or "")
