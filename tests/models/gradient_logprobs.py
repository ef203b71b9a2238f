"""The largest difference between the log-probs of sampled tokens computed by a forward program
and inside a gradient program (as the update recomputes the rollout's), float32, in the numerics
given, over `SHAPES` (rows, vocabulary: where XLA fuses the gradient program's log-softmax
otherwise depends on both, and on XLA's version); one JSON line.
`tests/models/test_invariant.py` runs it under XLA's default flags.

  python -m tests.models.gradient_logprobs invariant|fast
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from tlt_jax.models.sampling import SamplingParams, processed_logprobs

# (rows, vocabulary); in fast numerics at least one parts under jax 0.10 and 0.11 alike.
SHAPES = ((40, 49152), (64, 4096), (128, 49152))


def max_difference(numerics: str, rows: int = 40, vocab: int = 49152) -> float:
  rng = np.random.default_rng(0)
  h = jnp.asarray(rng.standard_normal((rows, 64)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((64, vocab)) * 0.3, jnp.float32)
  tokens = jnp.asarray(rng.integers(0, vocab, rows))
  params = SamplingParams(temperature=0.9, max_new_tokens=8)
  picked = lambda w: jnp.take_along_axis(
      processed_logprobs(h @ w, params, numerics), tokens[:, None], axis=1)[:, 0]
  forward = np.asarray(jax.jit(picked)(w))
  (_, in_gradient), grad = jax.jit(jax.value_and_grad(lambda w: (-picked(w).sum(), picked(w)),
                                                      has_aux=True))(w)
  assert np.isfinite(np.asarray(grad)).all()
  return float(np.abs(np.asarray(in_gradient) - forward).max())


if __name__ == "__main__":
  print(json.dumps({"numerics": sys.argv[1],
                    "max_diff": max(max_difference(sys.argv[1], *shape) for shape in SHAPES)}))
