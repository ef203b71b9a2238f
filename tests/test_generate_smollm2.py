"""The generation CLI on the real SmolLM2 weights, and the drafter shipped for it (slow)."""

import pytest

from experiments.configs import drafter_smollm2
from tests.test_launchers import last_json, run_module
from tlt_jax.drafter.warmup import shipped_drafters
from tlt_jax.workloads import drafter_key, drafter_recipe, workload_config


@pytest.mark.slow
def test_smollm2_served_by_its_shipped_drafter_knows_the_capital_of_france_as_plainly():
  """Greedy decoding on the real weights served by the drafter shipped as `smollm2`, by name,
  beside plain decoding (`--compare_plain`): exactly the same tokens, with the speeds of both.
  That drafter is the one `drafter_smollm2.py` makes, and `smollm2_eagle` its `:eagle` variant's
  (their keys: SmolLM2's weights, the recipe, the prompts), so the benchmarks load them instead of
  training."""
  sd = last_json(run_module("experiments.generate", "--model=smollm2", "--chat",
                            "--max_new_tokens=16", "--prompt=What is the capital of France?",
                            "--temperature=0", "--json", "--drafter=smollm2", "--compare_plain"))
  assert "Paris" in sd["text"] and sd["same_as_plain"] is True and sd["accept_len"] > 1.0
  assert sd["tokens_per_s"] > 0 and sd["plain_tokens_per_s"] > 0 and sd["speedup"] > 0
  for name, variant in (("smollm2", ""), ("smollm2_eagle", "eagle")):
    c = drafter_smollm2.get_config(variant)
    recipe = drafter_recipe(c.drafter, ("adaptive", "eval_prompts"))
    assert shipped_drafters()[name]["key"] == drafter_key(workload_config(c), recipe, c.seed)


@pytest.mark.slow
def test_smollm2_eagle_is_served_as_our_engine_drafts_it(tmp_path):
  """The shipped `smollm2_eagle` exported in the EAGLE-1 layout and run in a PyTorch loop that
  reads only the folders (transformers' Llama, vLLM's EAGLE-1 forward), greedy chain of 3 on 4
  held-out word problems: it accepts per step what our engine accepts with it, within 0.05, and
  its export drafts exactly as it does in our engine (only the draft vocabulary is not held)."""
  out = last_json(run_module("experiments.bench_served",
                             "--config=experiments/configs/bench_served.py",
                             "--config.bench.drafter=smollm2_eagle", "--config.bench.num_prompts=4",
                             "--config.rollout.max_new_tokens=64", f"--config.out_dir={tmp_path}"))
  assert out["architecture"] == "eagle" and len(out["notes"]) == 1, out
  assert out["served_in_our_engine"] == out["ours"] and out["ours"] > 1.8, out
  assert abs(out["pytorch_minus_engine"]) <= 0.05, out
