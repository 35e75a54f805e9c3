"""A self-contained HTML page for scored groups (used by ``process`` and ``jsonl2html``)."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;background:#fafafa;color:#222}
details{background:#fff;border:1px solid #ddd;border-radius:6px;margin:.5rem 0;padding:.3rem .8rem}
details.current{outline:2px solid #3b82f6}
summary{cursor:pointer;font-weight:600}
.rollout{border-top:1px solid #eee;padding:.5rem 0}
.score{display:inline-block;min-width:4rem;padding:0 .4rem;border-radius:4px;font-family:monospace}
.msg{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.85rem;margin:.2rem 0}
.role{font-weight:700;color:#555}
.help{color:#666;font-size:.85rem}
"""

_SCRIPT = """
const groups=[...document.querySelectorAll('details.group')];let i=0;
function focus(n){if(!groups.length)return;groups[i].classList.remove('current');
i=Math.max(0,Math.min(groups.length-1,n));groups[i].classList.add('current');
groups[i].scrollIntoView({block:'nearest'});}
document.addEventListener('keydown',e=>{
if(e.key==='j'||e.key==='ArrowDown'){focus(i+1);e.preventDefault();}
else if(e.key==='k'||e.key==='ArrowUp'){focus(i-1);e.preventDefault();}
else if(e.key==='Enter'||e.key==='o'){groups[i].open=!groups[i].open;}
else if(e.key==='e'){groups.forEach(g=>g.open=true);}
else if(e.key==='c'){groups.forEach(g=>g.open=false);}});
focus(0);
"""


def score_colour(score: float, low: float, high: float) -> str:
    """Red (lowest) to green (highest) as an HSL colour.

    >>> score_colour(1.0, 0.0, 1.0)
    'hsl(120, 70%, 85%)'
    >>> score_colour(0.0, 0.0, 0.0)
    'hsl(60, 70%, 85%)'
    """
    share = 0.5 if high <= low else (score - low) / (high - low)
    return f"hsl({round(120 * share)}, 70%, 85%)"


def _content(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def _message(message: Any) -> str:
    if not isinstance(message, dict):
        return f'<div class="msg">{html.escape(_content(message))}</div>'
    role = str(message.get("role", ""))
    role = html.escape(role[:1].upper() + role[1:])
    text = html.escape(_content(message.get("content", "")))
    return f'<div class="msg"><span class="role">{role}:</span> {text}</div>'


def _rollout(index: int, score: float, messages: Any, tokens: Any, low: float, high: float) -> str:
    parts = [
        f'<div class="rollout"><span class="score" style="background:'
        f'{score_colour(score, low, high)}">{score:.3f}</span> rollout {index}'
    ]
    if isinstance(messages, list) and messages:
        parts.extend(_message(message) for message in messages)
    elif isinstance(messages, str):
        parts.append(f'<div class="msg">{html.escape(messages)}</div>')
    elif tokens is not None:
        parts.append(f'<div class="msg">{len(tokens)} tokens (no text available)</div>')
    parts.append("</div>")
    return "".join(parts)


def render_group_html(
    group: dict[str, Any], number: int, low: float, high: float, *, skip_empty: bool = False
) -> str:
    """One group as a collapsible block, scores coloured on the scale ``low`` .. ``high``; a
    rollout per score that has its messages (or tokens). ``skip_empty``: "" when none has."""
    scores = [float(s) for s in group.get("scores") or []]
    mean = sum(scores) / len(scores) if scores else float("nan")
    messages = group.get("messages") or [None] * len(scores)
    tokens = group.get("tokens") or [None] * len(scores)
    rollouts = [
        _rollout(i, s, m, t, low, high)
        for i, (s, m, t) in enumerate(zip(scores, messages, tokens, strict=False))
    ]
    if skip_empty and not rollouts:
        return ""
    return (
        f'<details class="group" id="group-{number}"><summary>group {number} · '
        f'{len(rollouts)} rollouts · mean score <span class="score" style="background:'
        f'{score_colour(mean, low, high) if scores else "#eee"}">{mean:.3f}</span></summary>'
        f"{''.join(rollouts)}</details>"
    )


def score_range(groups: Iterable[dict[str, Any]]) -> tuple[float, float]:
    """The lowest and highest score of all groups ((0, 0) when there is none)."""
    every_score = [float(s) for g in groups for s in g.get("scores") or []]
    return (min(every_score), max(every_score)) if every_score else (0.0, 0.0)


def render_groups_html(groups: Iterable[dict[str, Any]], title: str) -> str:
    """One page: a collapsible block per group, scores coloured, j/k/Enter/e/c keys."""
    all_groups = list(groups)
    low, high = score_range(all_groups)
    body = [render_group_html(group, n, low, high) for n, group in enumerate(all_groups)]
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f'<p class="help">{len(all_groups)} groups. Keys: j/k or arrows move, Enter/o opens, '
        f"e expands all, c collapses all.</p>{''.join(body)}<script>{_SCRIPT}</script>"
        "</body></html>"
    )


def read_groups(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The groups of a JSONL dump (a line may hold one group or a list of them) and, for each
    line that is not one, why it was skipped (``path:line: reason``)."""
    groups: list[dict[str, Any]] = []
    skipped: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                group = json.loads(line)
            except json.JSONDecodeError as err:
                skipped.append(f"{path}:{number}: not JSON ({err.msg})")
                continue
            for item in group if isinstance(group, list) else [group]:
                if isinstance(item, dict) and isinstance(item.get("scores"), list):
                    groups.append(item)
                else:
                    skipped.append(f"{path}:{number}: not a group (needs a 'scores' list)")
    return groups, skipped
