"""Why the bf16 speculative-decoding test checks the rows it checks: for the peaked model it used
to run and for the successor model it runs now, the rounding noise between a decode step and a
full pass, each row's smallest winning margin, how many rows clear 4x the noise, and how many
rows speculative decoding changed. Prints one JSON object (figures in docs/BENCHMARKS.md).

  python -m tests.drafter.bf16_margins
"""

import json

import jax

from tests.drafter.test_drafter import (EAGLE, STOPS, TREE, _path_margins, _prompts, _run,
                                        _trained_drafter, peaked_model, successor_model)
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.spec.strategy import SpecConfig


def main():
  models = {"peaked": lambda dtype="float32": peaked_model(scale=8.0, dtype=dtype),
            "successor": successor_model}
  out = {}
  for name, make in models.items():
    target, drafter = make("bfloat16"), _trained_drafter(make())[0]
    for temperature in (0.0, 1.0):
      params = SamplingParams(temperature=temperature, max_new_tokens=24, stop_tokens=STOPS)
      prompts = _prompts(8, seed=5)
      plain, _ = _run(target, params, prompts, 2, key=3, buckets=(16,))
      margin_R, noise_R = _path_margins(target, prompts, 2, plain, params, key=3)
      row = {"noise": round(float(noise_R.max()), 4),
             "min_margin": round(float(margin_R.min()), 4),
             "rows_clear_of_4x_noise": int((margin_R > 4 * noise_R.max()).sum()),
             "rows": len(margin_R)}
      for arms in ((EAGLE[0],), (TREE[0],), (EAGLE[0], TREE[0])):
        sd, eng = _run(target, params, prompts, 2,
                       SpecConfig(threshold=16, rule="coupled", arms=arms, min_accept_len=0.0),
                       drafter, key=3, buckets=(16,))
        arm = "+".join(a.name for a in arms)
        row[f"rows_changed_by_sd[{arm}]"] = int((sd.tokens != plain.tokens).any(1).sum())
        row[f"accept_len[{arm}]"] = round(eng.spec.accept_len(), 3)
      out[f"{name}_T{temperature:g}"] = row
  out["jax"] = jax.__version__
  print(json.dumps(out))


if __name__ == "__main__":
  main()
