"""Run by test_multiprocess as one process or as several (`experiments.launch_local`): the
rollout of 6 prompts x 2 samples, greedy and sampled, spread over the processes; process 0
prints every row's tokens and lengths as JSON."""

import json

import jax
import numpy as np

from tests.conftest import small_config
from tlt_jax import distributed
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.spread import generate_spread


def main():
  distributed.initialize()
  model = init_model(small_config(), seed=0)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, 53, size=int(rng.integers(2, 14))).tolist() for _ in range(6)]
  engine = RolloutEngine(model, EngineConfig(batch_buckets=(2, 4, 8, 16), max_batch=16,
                                             steps_per_dispatch=4, precompile=False))
  out = {"processes": jax.process_count()}
  for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
    params = SamplingParams(temperature=temperature, top_p=0.9, max_new_tokens=20,
                            stop_tokens=(7, 9, 11))
    spread = generate_spread(engine, prompts, 2, params, jax.random.key(3))
    out[name] = {"tokens": spread.whole.tokens.tolist(),
                 "lengths": spread.whole.lengths.tolist(),
                 "local_rows": len(spread.local.lengths)}
  if distributed.is_writer():
    print(json.dumps(out))


if __name__ == "__main__":
  main()
