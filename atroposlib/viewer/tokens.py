"""HTML for one scored group: its prompt, each completion with its score, coloured tokens.

Tokens are coloured by one of three per-token signals: ``mask`` (trained or not),
``logprob`` (the sampler's ``inference_logprobs``: low probability is red) or ``advantage``
(blue above zero, red below). Hovering a token shows its id and every signal present.
Pure functions: a group dict and a decoder in, an HTML string out.
"""

from __future__ import annotations

import html
import logging
import math
from collections.abc import Sequence
from typing import Any, Literal

from atroposlib.export.text import Decoder, trained_span
from atroposlib.group import MASK_IGNORE_INDEX

logger = logging.getLogger(__name__)

ColourBy = Literal["mask", "logprob", "advantage"]
COLOUR_MODES: tuple[ColourBy, ...] = ("mask", "logprob", "advantage")
_FIELD: dict[ColourBy, str | None] = {
    "mask": None,
    "logprob": "inference_logprobs",
    "advantage": "advantages",
}

VIEW_CSS = """
.atv-group { font-family: ui-sans-serif, system-ui, sans-serif; }
.atv-prompt, .atv-tokens { white-space: pre-wrap; font-family: ui-monospace, monospace;
  font-size: 13px; line-height: 1.6; padding: 8px; border-radius: 6px; }
.atv-prompt { background: #f3f4f6; color: #374151; }
.atv-seq { border: 1px solid #e5e7eb; border-radius: 8px; margin: 10px 0; padding: 8px; }
.atv-head { font-weight: 600; margin-bottom: 4px; }
.atv-tok { border-radius: 2px; box-shadow: inset -1px 0 0 rgba(0, 0, 0, 0.12); }
.atv-note { color: #6b7280; font-size: 12px; }
"""


def _token_text(decoder: Decoder | None, token: int) -> str:
    return decoder.decode([token]) if decoder is not None else f"⟨{token}⟩"


def _background(mode: ColourBy, mask: int, value: float | None, scale: float) -> str:
    if mode == "mask":
        return "#dcfce7" if mask != MASK_IGNORE_INDEX else "#f3f4f6"
    if value is None or mask == MASK_IGNORE_INDEX:
        return "transparent"
    if mode == "logprob":
        probability = math.exp(min(0.0, value))
        return f"rgba(239, 68, 68, {0.85 * (1.0 - probability):.3f})"
    strength = min(1.0, abs(value) / scale) if scale > 0 else 0.0
    colour = "59, 130, 246" if value > 0 else "239, 68, 68"
    return f"rgba({colour}, {0.75 * strength:.3f})"


def _row(group: dict[str, Any], field: str | None, index: int) -> Sequence[float] | None:
    if field is None or not group.get(field):
        return None
    rows = group[field]
    return rows[index] if index < len(rows) else None


def _scale(group: dict[str, Any], mode: ColourBy) -> float:
    """The largest |value| of the signal in the whole group, so colours compare across rows."""
    field = _FIELD[mode]
    rows = group.get(field) or [] if field is not None else []
    return max((abs(value) for row in rows for value in row or []), default=0.0)


def _tokens_html(
    group: dict[str, Any],
    index: int,
    mode: ColourBy,
    decoder: Decoder | None,
    start: int,
    scale: float,
) -> str:
    tokens, masks = group["tokens"][index], group["masks"][index]
    values = _row(group, _FIELD[mode], index)
    advantages = _row(group, "advantages", index)
    logprobs = _row(group, "inference_logprobs", index)
    spans = []
    for position in range(start, len(tokens)):
        token, mask = tokens[position], masks[position]
        value = values[position] if values is not None and position < len(values) else None
        hint = [f"id {token}", "trained" if mask != MASK_IGNORE_INDEX else "not trained"]
        if logprobs is not None and position < len(logprobs):
            hint.append(f"logprob {logprobs[position] + 0.0:.3f}")
        if advantages is not None and position < len(advantages):
            hint.append(f"advantage {advantages[position] + 0.0:.3f}")
        spans.append(
            f'<span class="atv-tok" style="background:{_background(mode, mask, value, scale)}"'
            f' title="{html.escape(" · ".join(hint))}">'
            f"{html.escape(_token_text(decoder, token))}</span>"
        )
    return "".join(spans)


def _chat_text(chat: Sequence[dict[str, Any]]) -> str:
    return "\n".join(f"{message.get('role')}: {message.get('content')}" for message in chat)


def render_group(
    group: dict[str, Any], decoder: Decoder | None, mode: ColourBy = "mask", title: str = ""
) -> str:
    """The HTML view of one group; completions are listed best score first.

    Without a decoder, tokens show as ids and the group's ``messages`` (when present) give
    the readable prompt and replies.
    """
    scores = group["scores"]
    order = sorted(range(len(scores)), key=lambda index: (-scores[index], index))
    first_span = trained_span(group["masks"][order[0]]) if order else None
    prompt_end = first_span[0] if first_span else 0
    prompt_tokens = group["tokens"][order[0]][:prompt_end] if order else []
    messages = group.get("messages") or []
    if decoder is not None:
        prompt = decoder.decode(list(prompt_tokens))
    elif order and order[0] < len(messages) and messages[order[0]]:
        prompt = _chat_text(messages[order[0]][:-1])
    else:
        prompt = " ".join(f"⟨{t}⟩" for t in prompt_tokens)
    parts = [f'<div class="atv-group"><div class="atv-head">{html.escape(title)}</div>']
    parts.append(
        f'<div class="atv-head">Prompt</div><div class="atv-prompt">{html.escape(prompt)}</div>'
    )
    field = _FIELD[mode]
    if field is not None and not group.get(field):
        parts.append(
            f'<div class="atv-note">this group has no {field}; tokens are not coloured</div>'
        )
    scale = _scale(group, mode)
    for rank, index in enumerate(order, start=1):
        span = trained_span(group["masks"][index])
        start = span[0] if span else len(group["tokens"][index])
        tokens_html = _tokens_html(group, index, mode, decoder, start, scale)
        if decoder is None and index < len(messages) and messages[index]:
            reply = html.escape(_chat_text(messages[index][-1:]))
            tokens_html = f'<div class="atv-prompt">{reply}</div>{tokens_html}'
        parts.append(
            f'<div class="atv-seq" data-seq="{index}"><div class="atv-head">'
            f"Completion {rank} · sequence {index} · score {scores[index]:g}</div>"
            f'<div class="atv-tokens">{tokens_html}</div></div>'
        )
    parts.append("</div>")
    return "".join(parts)


def group_label(number: int, group: dict[str, Any]) -> str:
    """One-line summary for a picker: ``#3 · env 0 · 4 seqs · best 1 · mean 0.25``."""
    scores = group["scores"]
    env = group.get("env_id")
    best = max(scores) if scores else float("nan")
    mean = sum(scores) / len(scores) if scores else float("nan")
    return (
        f"#{number} · env {'-' if env is None else env} · {len(scores)} seqs"
        f" · best {best:g} · mean {mean:.3g}"
    )
