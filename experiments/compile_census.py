"""Where a test suite's (or any command's) XLA compile time goes: per test and per program, from
the census `experiments/census/sitecustomize.py` writes.

Run (the suite cold: an empty compilation cache, e.g. on a fresh clone):
  PYTHONPATH=experiments/census COMPILE_CENSUS_DIR=/tmp/census make test
  python -m experiments.compile_census --census_dir=/tmp/census
Prints the totals (backend compiles and their seconds, persistent-cache misses and hits, and the
cache keys missed more than once: programs built again by another process), then the tests and
the program names with the most compile seconds, and last one JSON object with the totals.
"""

from __future__ import annotations

import collections
import glob
import json
import os

from absl import app, flags

_DIR = flags.DEFINE_string("census_dir", None, "COMPILE_CENSUS_DIR of the census run.",
                            required=True)
_TOP = flags.DEFINE_integer("top", 25, "How many tests and program names to list.")


def read_census(log_dir: str) -> list[dict]:
  """Every record of a census directory (one JSON object per line, one file per process)."""
  records = []
  for path in sorted(glob.glob(os.path.join(log_dir, "*.jsonl"))):
    with open(path) as f:
      records.extend(json.loads(line) for line in f if line.strip())
  return records


def summarize(records: list[dict], top: int = 25) -> dict:
  """Totals, and the `top` tests and program names by compile seconds (each with its count)."""
  compiles = [r for r in records if r["ev"] == "compile"]
  misses = collections.Counter(r["key"] for r in records if r["ev"] == "miss")

  def ranked(field):
    seconds, count = collections.defaultdict(float), collections.Counter()
    for r in compiles:
      k = r[field].split(" (")[0]  # pytest's " (call)" / " (setup)" suffix
      seconds[k] += r["dur"]
      count[k] += 1
    return [(k, round(s, 1), count[k]) for k, s in
            sorted(seconds.items(), key=lambda kv: -kv[1])[:top]]

  return {"compiles": len(compiles), "compile_s": round(sum(r["dur"] for r in compiles), 1),
          "cache_misses": sum(misses.values()),
          "cache_hits": sum(r["ev"] == "hit" for r in records),
          "built_again": sum(n - 1 for n in misses.values() if n > 1),
          "by_test": ranked("test"), "by_program": ranked("name")}


def main(argv):
  del argv
  s = summarize(read_census(_DIR.value), _TOP.value)
  print(f"{s['compiles']} backend compiles, {s['compile_s']} s; persistent cache: "
        f"{s['cache_misses']} misses ({s['built_again']} of them a program built before), "
        f"{s['cache_hits']} hits")
  for title, rows in (("test", s["by_test"]), ("program", s["by_program"])):
    print(f"\n| compile s | programs | {title} |\n|---|---|---|")
    for name, seconds, count in rows:
      print(f"| {seconds} | {count} | {name} |")
  print(json.dumps({k: v for k, v in s.items() if not k.startswith("by_")}))


if __name__ == "__main__":
  app.run(main)
