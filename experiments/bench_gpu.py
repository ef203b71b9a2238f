"""One command for a GPU box: bench_cost, bench_rollout and bench_spec figures for models of
SmolLM2-135M's and Qwen2.5-1.5B's shapes in bf16 with the Pallas attention path, and SD
acceptance on the real SmolLM2 where it and its drafter are present. Writes one JSON per
benchmark and `bench_gpu.md` (a table for docs/BENCHMARKS.md) to `out_dir`; the last line is one
JSON object. Without a GPU it stops at once with a message. Where the box has jax but not the rest
(a CUDA container without a network), it first installs what is missing from wheels/, which
`make wheels` fills on a machine with a network.

  python -m experiments.bench_gpu --config=experiments/configs/bench_gpu.py
"""

import json
import os
import time

from experiments import wheels

# In a CUDA container without a network, what the box lacks of the project's pure-Python
# dependencies comes from wheels/ (`make wheels`), before the imports below need it.
wheels.ensure(command="python -m experiments.bench_gpu")

import jax  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from experiments import launch  # noqa: E402
from experiments.benchmarks import gpu  # noqa: E402
from tlt_jax.errors import ConfigError  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/bench_gpu.py")


def main(argv):
  del argv
  c = _CONFIG.value
  device = jax.devices()[0]
  if c.require_gpu and device.platform != "gpu":
    raise ConfigError(
        f"experiments.bench_gpu needs a GPU, and jax {jax.__version__} sees only "
        f"{device.platform} devices: run it on a GPU box (`make bench-gpu` installs "
        "jax[cuda12] and jax-triton where there is a network).")
  os.makedirs(c.out_dir, exist_ok=True)
  write = lambda name, obj: json.dump(obj, open(os.path.join(c.out_dir, f"{name}.json"), "w"),
                                      indent=1)
  results = {}
  for name, shape in c.shapes.items():
    t0 = time.perf_counter()
    shape = shape if isinstance(shape, str) else dict(shape)
    model = gpu.shape_model(shape, c.dtype, max(c.cache_len, c.rollout.prompt_len
                                                + c.rollout.new_tokens + 64))
    r = {"cost": gpu.cost(model, c.batches, c.tokens, c.cache_len, c.iters, c.rounds,
                          c.attention)}
    r["rollout"] = [gpu.rollout(model, rows, c.rollout.prompt_len, c.rollout.new_tokens,
                                c.attention) for rows in c.rollout.rows]
    r["spec"] = gpu.speculation(model, c.spec.rows, c.rollout.prompt_len, c.rollout.new_tokens,
                                c.spec.depth, c.attention, c.spec.repeats)
    for part, figures in r.items():
      write(f"{name}_{part}", figures)
    results[name] = r
    print(f"[bench_gpu] {name}: c(1,1) {r['cost']['step_ms_b1']} ms = "
          f"{r['cost']['step_over_floor_b1']}x the floor; verify/decode "
          f"{r['cost']['verify_over_decode']} ({time.perf_counter() - t0:.0f} s)", flush=True)
  summary = {"device": device.device_kind, "platform": device.platform, "dtype": c.dtype,
             "attention": c.attention, "date": time.strftime("%Y-%m-%d"),
             "shapes": {k: {"step_ms_b1": v["cost"]["step_ms_b1"],
                            "step_over_floor_b1": v["cost"]["step_over_floor_b1"],
                            "verify_over_decode": v["cost"]["verify_over_decode"],
                            "engine_step_ms": {x["rows"]: x["step_ms"] for x in v["rollout"]},
                            "sd_greedy_identical": v["spec"]["identical"]}
                        for k, v in results.items()}}
  if c.smollm2_drafter:
    summary["smollm2_acceptance"] = smollm2_acceptance(c)
    write("smollm2_acceptance", summary["smollm2_acceptance"])
  table = gpu.markdown(results, device.device_kind, c.dtype, c.attention)
  if device.platform == "cpu":
    table = "CPU: the Pallas kernel is interpreted; these times are not speed figures.\n\n" + table
  with open(os.path.join(c.out_dir, "bench_gpu.md"), "w") as f:
    f.write(table)
  print(table)
  write("summary", summary)
  print(json.dumps(summary))


def smollm2_acceptance(c) -> dict:
  """SD acceptance of the SmolLM2 drafter on its word problems."""
  w, drafter = gpu.smollm2_pair(c)
  return gpu.acceptance(w.model, drafter, w.prompts, c.smollm2.group_size, w.params, c.attention,
                        c.spec.depth, c.spec.repeats)


if __name__ == "__main__":
  launch.run(main)
