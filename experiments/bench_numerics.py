"""Invariant numerics against fast: c(B, T) of a decode step and a chain verify, and one update's
forward and backward (GRPO's token log-probs and their gradient), each pair timed in alternating
rounds so that a ratio comes from the same moments of the machine: the median over rounds of the
ratio of a round's fastest calls (on a shared 2-core machine the ratio of the run's two fastest
calls moved by 0.3 between runs at a step of 1 ms, this one by < 0.1); last line one JSON object.

  python -m experiments.bench_numerics --config=experiments/configs/bench_numerics.py:smollm2
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import config_flags

from experiments import launch
from tlt_jax.drafter.costs import alternating_times, step_runner
from tlt_jax.errors import ConfigError
from tlt_jax.models.config import NUMERICS
from tlt_jax.models.precision import Precision
from tlt_jax.models.pretrained import load_policy
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rl.grpo import token_logprobs

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/bench_numerics.py")


def round_ratio(times: dict, rounds: int) -> float:
  """The median over `rounds` of invariant's fastest call of a round over fast's (`times` of
  `alternating_times`, keyed by the mode first)."""
  fastest = {m: np.min(np.reshape(times[m], (rounds, -1)), axis=1) for m in NUMERICS}
  return float(np.median(fastest["invariant"] / fastest["fast"]))


def update_runner(model, rows: int, length: int):
  """One jitted forward and backward of the sum of `rows` x `length` token log-probs (the
  update's work, without the optimizer), compiled once."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, model.cfg.vocab_size, (rows, length)))
  prompt_len = jnp.full((rows,), length // 4, jnp.int32)
  params = SamplingParams(temperature=1.0, max_new_tokens=length)
  grad = nnx.jit(nnx.grad(lambda m: token_logprobs(m, tokens, prompt_len, length - length // 4,
                                                   params)[0].sum()))
  return lambda: jax.tree.leaves(nnx.state(grad(model)))[0]


def main(argv):
  del argv
  c = _CONFIG.value
  if c.update_rows < 0 or (c.update_rows and c.update_len < 4):
    raise ConfigError(f"update_rows={c.update_rows}, update_len={c.update_len}: time the update "
                      "over update_rows >= 1 rows of update_len >= 4 tokens, or skip it with "
                      "update_rows=0.")
  policy = load_policy(c.model)
  models = {mode: Precision(param_dtype="float32", compute_dtype=c.dtype,
                            numerics=mode).apply(policy) for mode in NUMERICS}
  steps = []
  print(f"{c.model}, {c.dtype}: c(B, T) ms over {c.prefix} of {c.cache_len} slots, fastest call "
        f"of {c.steps_per_call} steps of {c.rounds} alternating rounds, per step")
  print("   B    T      fast   invariant   invariant / fast (median of rounds)")
  for b in c.batches:
    runners = {(m, t): step_runner(models[m], b, t, c.cache_len, prefix=c.prefix)
               for m in NUMERICS for t in c.tokens}
    times = alternating_times({k: functools.partial(run, c.steps_per_call)
                               for k, run in runners.items()}, c.rounds, c.iters)
    for t in c.tokens:
      fast, inv = (1e3 * float(np.min(times[(m, t)])) / c.steps_per_call for m in NUMERICS)
      ratio = round_ratio({m: times[(m, t)] for m in NUMERICS}, c.rounds)
      steps.append({"B": b, "T": t, "fast_ms": round(fast, 3), "invariant_ms": round(inv, 3),
                    "ratio": round(ratio, 3)})
      print(f"{b:4d} {t:4d} {fast:9.3f} {inv:11.3f} {ratio:18.2f}")
  update = {}
  if c.update_rows:
    times = alternating_times({m: update_runner(models[m], c.update_rows, c.update_len)
                               for m in NUMERICS}, c.rounds, max(1, c.iters // 5))
    fast, inv = (float(np.min(times[m])) for m in NUMERICS)
    ratio = round_ratio(times, c.rounds)
    print(f"update forward and backward, {c.update_rows} x {c.update_len} tokens: fast "
          f"{fast:.3f} s, invariant {inv:.3f} s ({ratio:.2f}x)")
    update = {"update_fast_s": round(fast, 4), "update_invariant_s": round(inv, 4),
              "update_ratio": round(ratio, 3)}
  print(json.dumps({"model": c.model, "dtype": c.dtype, "prefix": c.prefix,
                    "cache_len": c.cache_len, "steps_per_call": c.steps_per_call, "steps": steps,
                    **update}))


if __name__ == "__main__":
  launch.run(main)
