"""The compile census (`experiments/compile_census.py`): its hook records a real process's
compiles and cache misses, and the summary ranks and counts them."""

import json
import os
import subprocess
import sys

from experiments.compile_census import read_census, summarize

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_hook_records_a_process_compiles_and_cache_misses(tmp_path):
  env = dict(os.environ, PYTHONPATH=os.path.join(_ROOT, "experiments", "census"),
             COMPILE_CENSUS_DIR=str(tmp_path / "census"), PYTEST_CURRENT_TEST="",
             JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu")
  code = "import jax; jax.jit(lambda x: x * 3 + 1)(2.0).block_until_ready()"
  subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
  s = summarize(read_census(str(tmp_path / "census")))
  assert s["compiles"] >= 1 and s["cache_misses"] >= 1 and s["built_again"] == 0
  assert any(name == "jit(<lambda>)" for name, _, _ in s["by_program"])
  assert all(test.startswith("-c") for test, _, _ in s["by_test"])  # no test: the command line


def test_the_summary_counts_ranks_and_finds_programs_built_twice(tmp_path):
  lines = {1: [dict(ev="miss", name="a", key="k1", test="t::one (call)"),
               dict(ev="compile", name="jit(fn)", dur=2.0, test="t::one (call)"),
               dict(ev="compile", name="jit(add)", dur=0.5, test="t::one (setup)")],
           2: [dict(ev="miss", name="a", key="k1", test="t::two (call)"),
               dict(ev="compile", name="jit(fn)", dur=3.0, test="t::two (call)"),
               dict(ev="hit", name="b", key="k2", test="t::two (call)")]}
  for pid, records in lines.items():
    (tmp_path / f"{pid}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  s = summarize(read_census(str(tmp_path)))
  assert (s["compiles"], s["compile_s"], s["cache_misses"], s["cache_hits"], s["built_again"]) == (
      3, 5.5, 2, 1, 1)
  assert s["by_test"] == [("t::two", 3.0, 1), ("t::one", 2.5, 2)]
  assert s["by_program"] == [("jit(fn)", 5.0, 2), ("jit(add)", 0.5, 1)]
