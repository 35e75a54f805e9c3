"""Pulling the final answer out of a model's reply: ``\\boxed{}``, ``<answer>`` tags, numbers.

Pure string functions, shared by the math-style environments and their reward functions.
"""

from __future__ import annotations

import re

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_GSM8K_MARK = re.compile(r"####\s*(.+)")


def strip_think(text: str) -> str:
    """Drop ``<think>…</think>`` blocks (and an unclosed one's opening).

    >>> strip_think("<think>2+2=5?</think>The answer is 4")
    'The answer is 4'
    """
    text = _THINK.sub("", text)
    return text.split("</think>")[-1]


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{…}`` (or ``\\fbox{…}``), nested braces balanced.

    >>> extract_boxed(r"so \\boxed{\\frac{1}{2}} and not \\boxed{3")
    '\\\\frac{1}{2}'
    >>> extract_boxed("no box") is None
    True
    """
    for marker in (r"\boxed{", r"\fbox{"):
        start = text.rfind(marker)
        if start < 0:
            continue
        depth, begin = 1, start + len(marker)
        for position in range(begin, len(text)):
            depth += {"{": 1, "}": -1}.get(text[position], 0)
            if depth == 0:
                return text[begin:position].strip()
        # unbalanced: look for an earlier, complete box
        earlier = extract_boxed(text[:start])
        if earlier is not None:
            return earlier
    return None


def final_answer(text: str) -> str:
    """The ``#### x`` answer, else the last ``\\boxed{x}``, else the text itself.

    >>> final_answer("work... #### 1,234"), final_answer(r"so \\boxed{7}"), final_answer("12")
    ('1,234', '7', '12')
    >>> final_answer(r"so \\boxed{\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    """
    marked = _GSM8K_MARK.findall(text)
    if marked:
        return str(marked[-1]).strip()
    boxed = extract_boxed(text)
    return text if boxed is None else boxed


def extract_answer_tag(text: str) -> str | None:
    """The content of the last ``<answer>…</answer>`` outside any ``<think>`` block.

    >>> extract_answer_tag("<think><answer>1</answer></think><answer> 7 </answer>")
    '7'
    >>> extract_answer_tag("answer: 7") is None
    True
    """
    found = _ANSWER_TAG.findall(strip_think(text))
    return found[-1].strip() if found else None


def normalize_number(text: str) -> str | None:
    """A number written as the canonical decimal string (commas, ``$``, ``%`` and ``.0`` gone).

    >>> normalize_number("$1,234.50")
    '1234.5'
    >>> normalize_number("18.0")
    '18'
    >>> normalize_number("twelve") is None
    True
    """
    cleaned = text.replace(",", "").replace("$", "").replace("%", "").strip().rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    if value.is_integer():
        return str(int(value))
    return repr(value)


def extract_final_number(text: str) -> str | None:
    """GSM8K-style final answer: the ``#### x`` mark, else a box, else the last number.

    >>> extract_final_number("She has 3 + 4 = 7 apples.\\n#### 7")
    '7'
    >>> extract_final_number(r"so \\boxed{1,200} dollars")
    '1200'
    >>> extract_final_number("It costs $12.50 in total.")
    '12.5'
    >>> extract_final_number("I don't know") is None
    True
    """
    text = strip_think(text)
    marked = _GSM8K_MARK.findall(text)
    candidates = [marked[-1]] if marked else []
    boxed = extract_boxed(text)
    if boxed is not None:
        candidates.append(boxed)
    candidates.extend(reversed(_NUMBER.findall(text)))
    for candidate in candidates:
        numbers = _NUMBER.findall(candidate)
        if numbers and (value := normalize_number(numbers[-1])) is not None:
            return value
    return None
