"""The memory plan (`tlt_jax/rl/memory.py`): exact parameter bytes from abstract shapes, the GPU
recipes planned on CPU, and the one-line error of a run that cannot fit its devices."""

import dataclasses
import json
import re

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.configs import hf_math, tiny_baseline, tiny_tlt
from tlt_jax.drafter.buffer import DataBuffer
from tlt_jax.errors import ConfigError
from tlt_jax.models import init_model
from tlt_jax.models.config import PRESETS, get_shape
from tlt_jax.models.kv_cache import init_cache
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.models.sharding import make_mesh
from tlt_jax.rl import memory, run
from tlt_jax.rl.config import run_config
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.memory import GB, PlanTarget, kv_bytes_per_row
from tlt_jax.rl.trainer import LoopConfig
from tlt_jax.rl.update import OptimConfig, PolicyBatch, PolicyUpdater
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.workloads import build_workload


def _plan(variant, **train):
  c = hf_math.get_config(variant)
  c.train.update(train)
  rc = run_config(c)
  return run.plan_for(rc, run.planned_shape(rc)[0], rc.plan)


def test_a_recipe_with_a_model_path_plans_that_model_and_says_so(tmp_path, capsys):
  """`plan_memory` of the 1.5B recipe given a model folder plans the folder's model (here a
  small Qwen2), not the recipe's shape, and names what it planned."""
  cfg = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=320,
             hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
             rope_theta=1e6, tie_word_embeddings=False)
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  c = hf_math.get_config("qwen2p5_1p5b_8xh100")
  c.model.path = str(tmp_path)
  rc = run_config(c)
  shape, source = run.planned_shape(rc)
  assert (shape.d_model, shape.n_layers, source) == (64, 2, f"model.path {tmp_path}")
  recipe = run.planned_shape(run_config(hf_math.get_config("qwen2p5_1p5b_8xh100")))
  assert recipe[0].d_model == 1536 and recipe[1] == "plan.shape qwen2p5_1p5b"
  rows = {name: b for name, b, _ in run.plan_for(rc, shape, rc.plan).rows}
  assert rows["parameters"] < 1e6  # the small model's, not 1.5B's


def test_parameter_bytes_are_the_models_and_split_over_the_update_mesh():
  c = tiny_baseline.get_config("small")
  c.rollout.max_new_tokens = 16
  rc = run_config(c)
  weights = sum(x.nbytes for x in jax.tree.leaves(nnx.state(init_model(PRESETS["tiny"]),
                                                            nnx.Param)))
  plan = run.plan_for(rc, run.planned_shape(rc)[0], PlanTarget(device_gb=1.0))
  rows = {name: b for name, b, _ in plan.rows}
  assert rows["parameters"] == weights and rows["optimizer state"] == 2 * weights
  c.train.mesh_shape = (1, -1, 1)  # fsdp halves every weight whose width splits evenly
  split = run.plan_for(run_config(c), PRESETS["tiny"], PlanTarget(devices=2, device_gb=1.0))
  assert dict((n, b) for n, b, _ in split.rows)["parameters"] == pytest.approx(weights / 2,
                                                                              rel=0.02)


def test_the_gpu_recipes_planned_on_cpu():
  """Qwen2.5-1.5B on 8 H100s fits 80 GB; the same recipe with 16 rows per micro-batch (no token
  budget) and no remat does not. Qwen2.5-7B on 64 H100s: its rollout shards are the update's
  devices, so the policy is resharded and never whole; with shards on half of each host's
  devices it is gathered whole on each process's first device first (30 GB more). With fsdp
  inside each host its update state and activations take twice the recipe's memory."""
  small = _plan("qwen2p5_1p5b_8xh100")
  assert small.fits and small.limit_bytes == 80 * GB
  assert not _plan("qwen2p5_1p5b_8xh100", max_tokens_per_micro_batch=0, remat="none").fits
  # 16 rows per device per micro-batch without the token budget: more than the budget's one
  assert _plan("qwen2p5_1p5b_8xh100", max_tokens_per_micro_batch=0).total_bytes > small.total_bytes
  big = _plan("qwen2p5_7b_64xh100")
  assert big.fits and "gathered policy" not in dict((n, b) for n, b, _ in big.rows)
  c = hf_math.get_config("qwen2p5_7b_64xh100")
  c.rollout.engine.num_shards = 2
  rc = run_config(c)
  half = run.plan_for(rc, run.planned_shape(rc)[0], rc.plan)
  gathered = dict((n, b) for n, b, _ in half.rows)["gathered policy"]
  assert gathered == pytest.approx(7.6e9 * 4, rel=0.01)  # float32 Qwen2.5-7B
  assert half.total_bytes - gathered == pytest.approx(big.total_bytes, rel=1e-9)
  per_host = _plan("qwen2p5_7b_64xh100", mesh_shape=(-1, 8, 1))
  assert per_host.total_bytes > 2 * big.total_bytes
  with pytest.raises(ConfigError, match=r"config.train.mesh_shape=\(3, -1, 1\) on 8 process\(es\) "
                                        r"x 8 device\(s\): .* do not split into groups of 3"):
    _plan("qwen2p5_7b_64xh100", mesh_shape=(3, -1, 1))


def test_a_plan_for_an_unknown_shape_is_one_line():
  c = hf_math.get_config("qwen2p5_1p5b_8xh100")
  c.plan.shape = "qwen2p5_15b"
  with pytest.raises(ConfigError, match=r"^config.plan: shape 'qwen2p5_15b' is not one of "
                                        r"\['qwen2p5_1p5b', 'qwen2p5_7b', 'smollm2_135m'\]\.$"):
    run_config(c)


def test_a_run_that_cannot_fit_its_device_is_one_line(monkeypatch):
  monkeypatch.setattr(run, "device_limit_bytes", lambda device: 2e9)
  c = hf_math.get_config("qwen2p5_1p5b_8xh100")
  c.train.mesh_shape = (1, 1, 1)
  rc = run_config(c)
  with pytest.raises(ConfigError, match=r"needs \d+\.\d GB per device and the device has 2\.0 GB;"
                                        r" the largest part is update activations"):
    run.check_fits(rc, run.planned_shape(rc)[0], 8192)


def test_a_kv_budget_sets_max_batch_to_the_largest_bucket_that_fits(capsys):
  """`rollout.engine.kv_cache_gb`: the row bytes are the engine's cache's (its layout's slots,
  rounded up as the engine rounds them, from the cache's abstract shapes), the largest fitting
  bucket becomes `max_batch` (printed, and planned), and a budget below the smallest bucket is
  one line."""
  c = tiny_baseline.get_config("small")
  c.rollout.max_new_tokens = 16
  c.rollout.engine.max_prompt_len = 20  # 32-token prefill bucket + 16 new: 64 slots
  rc = run_config(c)
  cfg = PRESETS["tiny"]
  engine = RolloutEngine(init_model(cfg, seed=0), rc.engine)
  longest = run.longest_prompt(rc, cfg, 16)
  cache_len = engine.programs.layout(16, False, longest).cache_len
  assert cache_len > longest + 16 + rc.engine.cache_slack  # rounded up
  cache = jax.eval_shape(lambda: init_cache(cfg, 8, cache_len, "float32"))
  row = sum(x.size * x.dtype.itemsize for x in (*cache.k, *cache.v)) / 8
  assert kv_bytes_per_row(cfg, rc.engine, cache_len, "float32") == row
  buckets = (1, 2, 4, 8)
  rc = dataclasses.replace(rc, engine=dataclasses.replace(rc.engine, batch_buckets=buckets,
                                                          max_batch=8))
  for budget, expect in ((4 * row, 4), (4 * row - 1, 2), (100 * row, 8)):
    rc = dataclasses.replace(rc, engine=dataclasses.replace(rc.engine, kv_cache_gb=budget / GB))
    assert run.engine_for(rc, cfg, 16).max_batch == expect
    assert f"kv_cache_gb={budget / GB:g}: max_batch={expect} " in capsys.readouterr().out
    kv = dict((n, b) for n, b, _ in run.plan_for(rc, cfg, PlanTarget(device_gb=1.0)).rows)
    assert kv["KV cache"] == expect * row
  rc = dataclasses.replace(rc, engine=dataclasses.replace(rc.engine, kv_cache_gb=row / GB / 2))
  with pytest.raises(ConfigError, match=r"kv_cache_gb=\S+ holds no batch bucket: one row's KV "
                                        r"cache \(\d+ slots\) is 0\.\d+ GB"):
    run.engine_for(rc, cfg, 16)


def test_the_plan_is_checked_and_said_in_one_line_where_the_run_is_built(monkeypatch):
  """Without a device limit (CPU) the plan has none and fits; with one it is compared."""
  rc = run_config(tiny_baseline.get_config("small"))
  plan = run.check_fits(rc, PRESETS["tiny"], 16)
  assert plan.fits and plan.summary()["limit_gb"] is None
  assert "GB per device (the device reports no limit), most of it " in run.plan_line(plan)
  monkeypatch.setattr(run, "device_limit_bytes", lambda device: 80e9)
  line = run.plan_line(run.check_fits(rc, PRESETS["tiny"], 16))
  assert re.fullmatch(r"\[run\] memory plan: \S+ GB per device of 80\.0 GB, most of it [a-z ]+ "
                      r"\(\S+ GB\); python -m experiments.plan_memory prints the table", line)


@pytest.mark.parametrize("shape,rows,tokens", [("tiny", 4, 256), ("smollm2_135m", 2, 256)])
def test_the_update_plan_is_within_1_5x_of_what_xla_allocates(shape, rows, tokens):
  """Without remat, the plan's update activations and micro-batch gradient against the
  temporaries of the compiled update program (`memory_analysis()`), for `tiny` and for two
  layers of SmolLM2-135M (its 49152-token head)."""
  cfg = PRESETS["tiny"] if shape == "tiny" else get_shape(shape).replace(n_layers=2)
  updater = PolicyUpdater(init_model(cfg, seed=0), make_mesh(1, 1, 1, jax.devices()[:1]),
                          GRPOConfig(), OptimConfig(), SamplingParams())
  n = tokens // 2
  zeros = lambda *s: np.zeros(s, np.float32)
  mb = PolicyBatch(np.zeros((rows, tokens), np.int32), np.full(rows, tokens - n, np.int32),
                   zeros(rows, n), zeros(rows), None, zeros(rows, n))
  compiled = updater.gradient(mb, lower=True).compile()
  measured = compiled.memory_analysis().temp_size_in_bytes
  loop = LoopConfig("unused", steps=1, prompts_per_step=rows, group_size=1, mesh_shape=(1, 1, 1))
  engine = EngineConfig(prefill_buckets=(tokens - n,), batch_buckets=(1,), max_batch=1)
  plan = memory.plan_memory(cfg, loop, engine, param_dtype="float32", compute_dtype="float32",
                            prompt_len=tokens - n, max_new_tokens=n, target=PlanTarget())
  parts = dict((name, b) for name, b, _ in plan.rows)
  planned = parts["update activations"] + parts["micro-batch gradient"]
  print(f"{shape}: measured {measured / 1e6:.1f} MB, planned {planned / 1e6:.1f} MB")
  assert planned / 1.5 < measured < planned * 1.5, (measured / 1e6, planned / 1e6)


def test_an_adaptive_drafter_s_data_is_planned_as_a_rollout_holds_it():
  """`tiny_tlt`'s plan has the adaptive drafter's buffer (its ring, exactly) and bounds the hidden
  states a rollout of a step's 16 prompts x 8 captures and holds on the device until the buffer
  takes them: each batch a wave compacts out of is harvested whole (`rollout/captured.py`)."""
  rc = run_config(tiny_tlt.get_config())
  w = build_workload(rc.workload, rc.loop.prompts_per_step, rc.seed)
  plan = run.plan_for(rc, PRESETS["tiny"], PlanTarget(), w.params.max_new_tokens)
  planned = dict((n, b) for n, b, _ in plan.rows)["drafter data"]
  ring = DataBuffer(rc.adaptive.buffer, w.model.cfg.d_model, w.model.cfg.dtype).ring_CxD.nbytes
  res = RolloutEngine(w.model, rc.engine, pad_id=w.tokenizer.pad_id).generate(
      w.prompts, rc.loop.group_size, w.params, jax.random.key(0), capture_hidden=True)
  held = sum(p.hidden_BxNxD.nbytes + p.prompt_hidden_BxD.nbytes for p in res.hidden.pieces)
  own = res.hidden.rows * (res.hidden.n + 1) * w.model.cfg.d_model * 4  # each row's once
  assert held > own  # compaction's copies hold more than the rows' own states
  assert ring + held <= planned <= ring + 2 * own
