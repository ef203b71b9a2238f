"""Numeric answer extraction and verification for math word problems.

`extract_answer` reads the final answer a response commits to, in order of precedence: the last
`#### N` (GSM8K), `\\boxed{N}`, "the answer is N", else the last number in the text. Numbers may
carry thousands separators, a sign, decimals, simple fractions (`3/4`, `\\frac{3}{4}`), currency and
trailing units. A response that states several *different* final answers of the chosen kind gets
no answer (and so no credit). Values compare exactly as fractions: `0.5` equals `1/2`.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUM = r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?"
_NUM_RE = re.compile(_NUM)
_FRAC_TEX = re.compile(r"\\[dt]?frac\{\s*(-?[\d.,]+)\s*\}\{\s*(-?[\d.,]+)\s*\}")
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:)", re.IGNORECASE)


def boxed_content(text: str) -> str | None:
  """The content of the last `\\boxed{...}` in `text` (one level of nested braces), or None."""
  found = _BOXED.findall(text)
  return found[-1].strip() if found else None


def parse_number(text: str) -> Fraction | None:
  """The first number in `text` as an exact fraction, or None."""
  text = _FRAC_TEX.sub(lambda m: f"{m.group(1)}/{m.group(2)}", text)
  m = _NUM_RE.search(text.replace("−", "-"))
  if m is None:
    return None
  s = m.group(0).replace("$", "").replace(",", "").replace(" ", "")
  try:
    if "/" in s:
      num, den = s.split("/")
      return Fraction(num) / Fraction(den) if Fraction(den) != 0 else None
    return Fraction(s)
  except (ValueError, ZeroDivisionError):
    return None


def _single(values: list[Fraction | None]) -> Fraction | None:
  values = [v for v in values if v is not None]
  if not values or any(v != values[-1] for v in values):
    return None  # nothing, or conflicting final answers
  return values[-1]


def extract_answer(text: str) -> Fraction | None:
  """The final numeric answer a response commits to, or None (none, or conflicting)."""
  if "####" in text:
    return _single([parse_number(part) for part in text.split("####")[1:]])
  boxed = _BOXED.findall(text)
  if boxed:
    return _single([parse_number(b) for b in boxed])
  stated = _ANSWER_IS.split(text)[1:]
  if stated:
    return _single([parse_number(s.split("\n")[0]) for s in stated])
  numbers = _NUM_RE.findall(_FRAC_TEX.sub(lambda m: f"{m.group(1)}/{m.group(2)}",
                                          text.replace("−", "-")))
  return parse_number(numbers[-1]) if numbers else None


def verify(response: str, gold) -> float:
  """1.0 when the response's final answer equals `gold` (number or string), else 0.0."""
  want = gold if isinstance(gold, Fraction) else parse_number(str(gold))
  got = extract_answer(response)
  return 1.0 if (want is not None and got is not None and got == want) else 0.0
