"""Run by test_multiprocess as one process or as several (`experiments.launch_local`): the
rollout of 6 prompts x 2 samples, greedy and sampled, spread over the processes, and a sampled
one under prompt-addressed noise that replays the first halves of its own earlier responses;
process 0 prints every row's tokens and lengths as JSON."""

import json

import jax
import numpy as np

from tests.conftest import small_config
from tlt_jax import distributed
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.noise import PromptNoise
from tlt_jax.rollout.spread import generate_spread


def main():
  distributed.initialize()
  model = init_model(small_config(), seed=0)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(3, 53, size=int(rng.integers(2, 14))).tolist() for _ in range(6)]
  layout = EngineConfig(batch_buckets=(2, 4, 8, 16), max_batch=16, steps_per_dispatch=4,
                        precompile=False)
  engine = RolloutEngine(model, layout)
  out = {"processes": jax.process_count()}
  for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
    params = SamplingParams(temperature=temperature, top_p=0.9, max_new_tokens=20,
                            stop_tokens=(7, 9, 11))
    spread = generate_spread(engine, prompts, 2, params, jax.random.key(3))
    out[name] = {"tokens": spread.whole.tokens.tolist(),
                 "lengths": spread.whole.lengths.tolist(),
                 "local_rows": len(spread.local.lengths)}
  replaying = RolloutEngine(model, layout, noise="prompt", replay_chunk=4)
  addresses = PromptNoise().addresses(prompts, 2)
  first = generate_spread(replaying, prompts, 2, params, jax.random.key(3), addresses=addresses)
  stored = [first.whole.response(i)[: first.whole.lengths[i] // 2] for i in range(12)]
  again = generate_spread(replaying, prompts, 2, params, jax.random.key(3), addresses=addresses,
                          replay=stored)
  out["replayed"] = {"tokens": again.whole.tokens.tolist(), "lengths": again.whole.lengths.tolist(),
                     "local_rows": len(again.local.lengths),
                     "same_as_first": bool(np.array_equal(again.whole.tokens, first.whole.tokens)),
                     "replay_fraction": again.local.timeline.summary()["replay_fraction"]}
  if distributed.is_writer():
    print(json.dumps(out))


if __name__ == "__main__":
  main()
