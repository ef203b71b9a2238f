"""GRPO on your own model and data: a local Hugging Face folder (Llama, Qwen2, Qwen3), a `.gguf`
file or a preset as `model.path`, and dataset files as `task.dataset` / `task.test_dataset`
(`.jsonl`, `.json`, `.parquet`: GSM8K, MATH, verl's RL parquet, or any columns named by
`task.prompt_key` / `task.answer_key`; see tlt_jax/tasks/datasets.py). Without a test file the
held-out set is the held-out side of the training file (`task.test_fraction` of prompt space, by
a stable hash of the prompt). The reward is `task.reward` (tlt_jax/tasks/rewards.py).

Run:
  python -m experiments.train_grpo --config=experiments/configs/hf_math.py \
    --config.model.path=/path/to/Qwen2.5-0.5B-Instruct \
    --config.task.dataset=gsm8k/train.jsonl --config.task.test_dataset=gsm8k/test.jsonl
Variants, combined with commas: `tlt` (speculative decoding under `coupled` and the adaptive
drafter, warmed up from the model's own rollouts; it trains on rollout shards that finish early,
and on one device not at all unless `drafter.adaptive.spot.budget_share` gives it a share of each
rollout's seconds), `small` (sized for CPU tests; two drafter steps per RL step):
  python -m experiments.train_grpo --config=experiments/configs/hf_math.py:tlt,small \
    --config.model.path=DIR --config.task.dataset=train.jsonl --config.task.test_dataset=test.jsonl
Recipes for GPU nodes (`qwen2p5_1p5b_8xh100`: Qwen2.5-1.5B-Instruct on one host of 8 H100 80 GB;
`qwen2p5_7b_64xh100`: Qwen2.5-7B-Instruct on 8 hosts x 8 H100), GRPO with 8 samples per prompt
at T = 0.9 and responses up to 8K tokens, combinable with `tlt`; their memory, planned from the
shapes alone (no weights needed; docs/SCALING.md has the tables):
  python -m experiments.plan_memory --config=experiments/configs/hf_math.py:qwen2p5_1p5b_8xh100
The warm-up drafter alone (cached by model and data; `:tlt` then loads it):
  python -m experiments.drafter_warmup --config=experiments/configs/hf_math.py:drafter \
    --config.model.path=DIR --config.task.dataset=train.jsonl
"""

import ml_collections

from experiments.configs import base

CD = ml_collections.ConfigDict
VARIANTS = ("tlt", "small", "drafter", "qwen2p5_1p5b_8xh100", "qwen2p5_7b_64xh100")


def _recipe(c: ml_collections.ConfigDict, name: str) -> None:
  """A GPU recipe's layout (module docstring): bf16 compute and cache over float32 masters,
  one rollout shard per device (1.5B) or per pair (7B, tp = 2) with a KV cache budget that sets
  its batch (64 rows in 16 GB; 16 rows in 4 GB), the update fully sharded over every device of
  every host (7B's heads, MLP and logits also split over tp = 2), micro-batches of at most 8704
  tokens per device (one row of 512 + 8192 tokens, or several shorter ones), rematerialised.
  The rollout shards are the update's devices, so each sync reshards the policy into them and
  no device holds it whole; docs/SCALING.md."""
  big = name == "qwen2p5_7b_64xh100"
  c.model.compute_dtype = "bfloat16"  # over float32 masters (the default param_dtype)
  c.rollout.max_new_tokens = 8192
  c.rollout.engine.update(dict(prefill_buckets=(128, 256, 512), max_prompt_len=512,
                               cache_dtype="bfloat16", num_shards=4 if big else 8,
                               kv_cache_gb=4.0 if big else 16.0))  # 0.25 GB per row
  if big:  # else its default buckets
    c.rollout.engine.update(dict(tp=2, batch_buckets=(1, 2, 4, 8, 16)))
  # The update's fsdp spans every device of every process (-1); 7B's also splits its heads, MLP
  # and logits over tp = 2. Micro-batches of at most one full row (512 + 8192 tokens) per
  # device; shorter rows share one.
  c.train.update(dict(prompts_per_step=256 if big else 64, mesh_shape=(1, -1, 2 if big else 1),
                      mini_batches=8 if big else 4, max_tokens_per_micro_batch=8704,
                      remat="full" if big else "dots"))
  c.plan = CD(dict(shape="qwen2p5_7b" if big else "qwen2p5_1p5b", devices=8))  # 80 GB each
  if big:
    c.plan.processes = 8


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  chosen = [v for v in variant.split(",") if v]
  unknown = [v for v in chosen if v not in VARIANTS]
  if unknown:
    raise ValueError(f"Unknown variant {unknown[0]!r}; combine {', '.join(VARIANTS)} with commas.")
  small = "small" in chosen
  c = CD()
  c.name = "hf_math"
  c.out_dir = base.run_dir("hf_math", ",".join(chosen))
  c.cache_dir = ""  # empty: $TLT_JAX_CACHE or <repo>/.cache
  c.seed = 0
  c.model = CD(dict(name="math", path=""))
  c.task = CD(dict(dataset="", test_dataset=""))
  c.rollout = CD(dict(temperature=0.9, max_new_tokens=16 if small else 512))
  c.rollout.engine = CD(dict(prefill_buckets=(64, 128, 256, 512)))
  if small:
    c.rollout.engine.update(dict(batch_buckets=(4, 8), max_batch=8))
  c.spec = CD()
  c.drafter = CD()
  c.rl = base.rl(lr=1e-6 if not small else 1e-5, warmup_steps=0 if small else 10)
  c.distributed = base.distributed()
  c.train = base.train(steps=2 if small else 200, num_prompts=100_000, prompts_per_step=2 if small
                       else 32, group_size=4 if small else 8, eval_every=2 if small else 20,
                       eval_prompts=4 if small else 256, checkpoint_every=1 if small else 20)
  if small:
    c.train.eval_group_size = 2
  if "tlt" in chosen or "drafter" in chosen:
    c.spec = base.spec((("eagle", 3, 0), ("plain", 1, 0)), threshold=4 if small else 8)
    c.drafter = base.smollm2_drafter(small, teacher_forced=True)
    c.drafter.model = CD(dict(ce_weight=0.5))  # the model's own head, whole
    if small:
      c.drafter.warmup.seq_len = 64
    c.drafter.adaptive = base.adaptive(small)
    c.train.export = True
  for name in ("qwen2p5_1p5b_8xh100", "qwen2p5_7b_64xh100"):
    if name in chosen:
      _recipe(c, name)
  if "drafter" in chosen:  # `experiments.drafter_warmup`'s config: the recipe, on one device
    c.name = "hf_math_drafter"
    c.drafter.adaptive = CD()
    c.drafter.eval_prompts = 2 if small else 16
  return c
