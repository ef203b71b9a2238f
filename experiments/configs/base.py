"""The sections configs share, with the values their runs use; a config file takes the sections it
needs from here and changes what its run changes. This is the one shared base: no config file
imports another. What each section holds: tlt_jax/rl/config.py.

`small` variants are the tests' CPU-sized versions of the same recipes.
"""

import ml_collections

CD = ml_collections.ConfigDict
# A few-thousand-parameter llama shape (random weights): the GPU benchmark's and proof's CPU runs.
TOY_SHAPE = dict(family="llama", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                 d_ff=64)


def warm_start(small: bool = False) -> CD:
  """The `tiny` policy's SFT warm start on the built-in arithmetic task (the shipped one is this
  recipe; `make warmstart` re-makes it). Also `experiments.sft_warmstart`'s whole config; `small`:
  20 steps, the SFT launcher's test variant (`sft_tiny.py:small`)."""
  c = CD()
  c.model = "tiny"
  c.seed = 0
  c.cache_dir = ""  # empty: the run's cache_dir, else $TLT_JAX_CACHE or <repo>/.cache
  c.task = CD(dict(min_steps=1, max_steps=16, alpha=1.3, max_operand=9))
  c.train = CD(dict(
      steps=700, tokens_per_batch=8192, lr=3e-3, warmup_steps=60, weight_decay=0.01, clip=1.0,
      num_problems=50_000, task_alpha=0.5))
  c.eval = CD(dict(num_prompts=128, group_size=8, temperature=1.0, seed=1234))
  if small:
    c.train.steps = 20
    c.train.tokens_per_batch = 2048  # a quarter of the recipe's: the loss still falls 3.2 -> 2.8
    c.train.num_problems = 2000
    c.eval.num_prompts = 8
    c.eval.group_size = 4
  return c


def tiny_model() -> CD:
  """The warm-started `tiny` policy: the shipped warm start, in the `small` test variants too
  (training a small one cost each fresh checkout's test suite half a minute). Its precision
  (`param_dtype`, `compute_dtype`: float32, the defaults of tlt_jax/models/precision.py, fastest
  on CPU) is set by a run that changes it."""
  return CD(dict(name="tiny", warm_start=warm_start()))


def smollm2_model() -> CD:
  return CD(dict(name="smollm2"))


def tiny_task(**settings) -> CD:
  """The built-in arithmetic task (its problem generator: the warm start's `task`). `reward`:
  answer | progress (partial credit for the steps before an error); `difficulty`: fields of the
  generator narrowed for the training pool only."""
  return CD(dict(dict(reward="answer", difficulty={}), **settings))


def word_problems_task(**settings) -> CD:
  """SmolLM2's procedural word problems. A 135M model given GSM8K's '####' instruction rambles
  past any length limit; asked to be brief it states its answer (which the verifier reads)."""
  return CD(dict(dict(reward="answer", difficulty={},
                      word_problems=dict(min_steps=1, max_steps=2, max_value=20),
                      instruction="Answer briefly."), **settings))


def rollout(small: bool = False, **sampling) -> CD:
  """Sampling (`max_new_tokens` 0: the task's own maximum) and the engine's layout: `num_shards`
  data-parallel shards of `tp` devices each (tensor parallelism within a shard)."""
  c = CD(dict(dict(max_new_tokens=24) if small else {}, **sampling))
  # The `tiny` runs draw 16 prompts x 8 samples: 128 rows in one wave (the engine's own default
  # stops at 64).
  c.engine = CD(dict(batch_buckets=(1, 2, 4, 8, 16, 32, 64, 128), max_batch=128))
  if small:  # two batch buckets (16 rows compacting to 4): every bucket is programs to build
    c.engine.batch_buckets, c.engine.max_batch = (4, 16), 16
  return c


def smollm2_rollout(small: bool = False) -> CD:
  """SmolLM2 on the word problems: temperature 0.9 as in TLT, up to 256 new tokens."""
  c = rollout(temperature=0.9, max_new_tokens=8 if small else 256)
  c.engine.update(dict(batch_buckets=(1, 2, 4, 8, 16, 32), max_batch=32,
                       prefill_buckets=(64, 128, 256)))
  return c


def tiny_workload(small: bool = False) -> CD:
  """What a benchmark of the warm-started `tiny` policy samples: its model, task and rollout
  (seed 7, as the GRPO runs')."""
  return CD(dict(cache_dir="",  # empty: $TLT_JAX_CACHE or <repo>/.cache
                 seed=7, model=tiny_model(), task=tiny_task(), rollout=rollout(small)))


def smollm2_workload(small: bool = False) -> CD:
  """What a benchmark of SmolLM2-135M-Instruct samples: the word problems at temperature 0.9."""
  return CD(dict(cache_dir="", seed=7, model=smollm2_model(), task=word_problems_task(),
                 rollout=smollm2_rollout(small)))


def spec(arms: tuple, **settings) -> CD:
  """Speculative decoding under the `coupled` rule (the same run as plain sampling) with the
  bandit's `arms`: (proposer, depth, ngram) chains, ('tree', depth, topk, nodes) EAGLE-2 trees,
  ('plain', 1, 0)."""
  return CD(dict(arms=arms, **settings))


def tiny_drafter(small: bool = False) -> CD:
  """The warm-up EAGLE drafter of the warm-started `tiny` policy, trained on its rollouts of
  `warmup_prompts` prompts; `adaptive` empty: it stays frozen."""
  c = CD()
  c.model = CD()
  c.train = CD(dict(lr=3e-3))
  c.warmup = CD()
  c.adaptive = CD()
  if small:
    c.warmup.steps, c.warmup.batch_rows, c.warmup_prompts = 10, 8, 8
  return c


def smollm2_drafter(small: bool = False, teacher_forced: bool = False) -> CD:
  """SmolLM2's warm-up EAGLE drafter with a draft vocabulary restricted to the 4096 tokens most
  frequent in its own rollouts, trained for sampling at T = 0.9: draft depths 2 and 3 as they run,
  on the drafter's own outputs (EAGLE-3's training-time test; each step costs about three), soft
  labels at the rollout temperature and a total-variation term (one minus the rejection rule's
  acceptance). `teacher_forced`: TLT's recipe (depth 1 only, labels at T = 1, no TV)."""
  c = CD()
  c.model = CD(dict(ce_weight=0.5, draft_vocab=512 if small else 4096))
  if not teacher_forced:
    c.model.update(unroll_steps=3, unroll_decay=0.8, label_temperature=0.9, tv_weight=0.5)
  c.train = CD(dict(lr=1e-3, warmup_steps=30))
  c.warmup = CD(dict(steps=4 if small else (600 if teacher_forced else 400),
                     batch_rows=4 if small else 16, seq_len=384))
  c.warmup_prompts = 4 if small else 256
  c.adaptive = CD()
  return c


def adaptive(small: bool = False) -> CD:
  """The adaptive drafter: spot training from captured hidden states on rollout shards that
  finish early, checked publishing. On one device it trains only where a recipe gives it a
  budget (`spot.budget_s`, `budget_share`, `budget_steps`); its share of each step is
  `drafter/overhead`. `small`: two drafter steps per RL step whatever they cost, the same on
  every machine, of 4 segments of 64 tokens (the tests' rollouts are a few short ones: the
  default 16 x 128 was mostly padding, and SmolLM2's drafter step took 7 s)."""
  c = CD(dict(spot=dict()))
  if small:
    c.spot.budget_steps, c.spot.min_segments = 2, 4
    c.spot.batch_rows, c.spot.seq_len = 4, 64
  return c


def rl(**optim) -> CD:
  """The learner by name (grpo | gspo | dapo: tlt_jax/rl/learners.py; its settings in `rl.<name>`,
  absent: its defaults) and AdamW (its `total_steps` default, 0: every optimizer step of the run,
  `train.steps` x `train.mini_batches` x `train.update_epochs`)."""
  c = CD()
  c.learner = "grpo"
  c.optim = CD(optim)
  return c


def distributed(**settings) -> CD:
  """The process group (`tlt_jax.distributed`): the coordinator (host:port of process 0) and
  process count, empty/0 to take them from the environment (`experiments.launch_local`, SLURM,
  cloud TPU) or to run as one process; seconds to wait for every process at start-up and before
  a lost peer ends the run."""
  return CD(settings)


def train(**loop) -> CD:
  """The loop: `steps` of `prompts_per_step` prompts from a pool of `num_prompts` x `group_size`
  samples; the update in `micro_batches` on a `mesh_shape` = (data, fsdp[, tp]) mesh over every
  process's devices (-1: every device left; the default (-1, 1, 1) is data parallel); a checkpoint
  every `checkpoint_every` steps; `eval_prompts` held-out prompts x `eval_group_size` scored every
  `eval_every` steps (0: off); `export`: the final policy (and drafter) to out_dir/export."""
  # A run checkpoints (to resume) and evaluates held out every 5 steps; the loop's own
  # defaults do neither, for the library's other users.
  return CD(dict(dict(steps=20, num_prompts=512, prompts_per_step=16, group_size=8,
                      checkpoint_every=5, eval_every=5, eval_prompts=64), **loop))


def run_dir(name: str, variant: str = "") -> str:
  """A recipe's default run directory, `runs/<name>[_<variant>]`: no two recipes (or variants
  of one) share a directory, which holds one run (`tlt_jax/rl/rundir.py`)."""
  return f"runs/{name}" + (f"_{variant.replace(',', '_')}" if variant else "")


def tiny_run(name: str, variant: str = "") -> CD:
  """GRPO on the built-in task from the warm-started `tiny` policy, without speculative decoding
  (`tiny_tlt` adds it to this same run). Variants: '' (20 steps of 16 prompts x 8), 'small' (the
  tests'), 'long' (160 steps of 64 prompts x 8 on fresh prompts), 'scale' (5 steps of 8 prompts
  x 8, few batch buckets: the multi-process tests' and `bench_scale`'s)."""
  small = variant == "small"
  c = CD()
  c.name = name if variant != "long" else f"{name}_long"
  c.out_dir = run_dir(name, variant)
  c.cache_dir = ""  # empty: $TLT_JAX_CACHE or <repo>/.cache
  c.seed = 7
  c.model = tiny_model()
  c.task = tiny_task(difficulty=dict(min_steps=1, max_steps=16))
  c.rollout = rollout(small)
  c.spec = CD()     # empty: no speculative decoding
  c.drafter = CD()  # empty: no drafter
  c.rl = rl(lr=2e-4, warmup_steps=2)
  # Each response weighs the same (GRPO's default weighs each token the same): the recipe the
  # demo's held-out gain was measured with; token aggregation did no better here (BENCHMARKS).
  c.rl.grpo = CD(dict(aggregation="sequence"))
  c.train = train()
  c.distributed = distributed()
  if small:
    c.train.update(dict(num_prompts=16, steps=3, prompts_per_step=4, group_size=4,
                        checkpoint_every=1, eval_every=2, eval_prompts=4, eval_group_size=2))
  elif variant == "long":
    c.train.update(dict(num_prompts=50_000,  # fresh prompts: a small pool gets memorised
                        prompts_per_step=64, steps=160, eval_every=20, eval_prompts=256,
                        micro_batches=8))  # length-sorted groups: each pays only its padding
    c.rl.optim.lr = 3e-4
  elif variant == "scale":
    c.train.update(dict(num_prompts=64, steps=5, prompts_per_step=8, group_size=8,
                        checkpoint_every=1, eval_every=0))
    c.rollout.engine.batch_buckets, c.rollout.engine.max_batch = (2, 8, 32, 64), 64
  return c


def smollm2_run(name: str, small: bool = False) -> CD:
  """GRPO on SmolLM2-135M-Instruct with the procedural word problems, without speculative
  decoding: 8 steps of 8 prompts x 8 samples (T = 0.9), held-out accuracy before the first step
  and after the last."""
  c = CD()
  c.name = name
  c.out_dir = run_dir(name, "small" if small else "")
  c.cache_dir = ""  # empty: $TLT_JAX_CACHE or <repo>/.cache
  c.seed = 0
  c.model = smollm2_model()
  # Single-change problems with numbers up to 10: easy enough for the 135M model that groups of 8
  # get mixed rewards, which is what GRPO learns from (docs/BENCHMARKS.md has its accuracy).
  easy = dict(min_steps=1, max_steps=1, max_value=10)
  c.task = word_problems_task(word_problems=easy, difficulty=easy)
  c.rollout = smollm2_rollout(small)
  c.rollout.max_new_tokens = 8 if small else 128
  # The engine's default batch buckets (up to 64 rows: 8 prompts x 8), SmolLM2's prefill buckets.
  c.rollout.engine = CD(dict(prefill_buckets=c.rollout.engine.prefill_buckets))
  if small:  # 4 rows: two batch buckets (each is programs to build)
    c.rollout.engine.update(dict(batch_buckets=(2, 4), max_batch=4))
  c.spec = CD()     # empty: no speculative decoding
  c.drafter = CD()  # empty: no drafter
  c.rl = rl(warmup_steps=1)  # lr: the default, 1e-5
  c.distributed = distributed()
  c.train = train(
      steps=8, num_prompts=2048,  # the training prompt pool (fresh prompts, not a few re-drawn)
      prompts_per_step=8, group_size=8, micro_batches=4,
      eval_every=8, eval_prompts=128, eval_group_size=2)
  if small:
    c.train.update(dict(num_prompts=8, steps=2, prompts_per_step=2, group_size=2,
                        micro_batches=1, checkpoint_every=1, eval_every=0, eval_prompts=2))
  return c


def with_tlt(c: CD, small: bool = False) -> CD:
  """Run `c` with speculative decoding (`coupled`: the same run, token for token) and the
  warmed-up EAGLE drafter, which keeps adapting to the policy; the final policy and drafter are
  exported."""
  c.spec = spec((("eagle", 3, 0), ("eagle", 6, 0), ("suffix", 4, 3), ("plain", 1, 0)),
                **(dict(threshold=16) if small else {}))
  c.drafter = tiny_drafter(small)
  c.drafter.adaptive = adaptive(small)
  c.train.export = True
  return c


def demo_tlt(c: CD, small: bool = False) -> CD:
  """The demo's TLT settings on a `with_tlt` run: two proposers besides the plain arm (fewer
  programs for the warm-up to build) and, unless `small`, the warm-up drafter shipped with the
  package (150 warm-up steps: nothing trains before the run)."""
  if not small:
    c.drafter.warmup.steps = 150
  c.spec.arms = (("eagle", 3, 0), ("suffix", 4, 3), ("plain", 1, 0))
  return c
