"""Offline warm-up of the EAGLE drafter for SmolLM2-135M-Instruct on the word problems
(temperature 0.9, up to 256 new tokens, as `bench_rollout_smollm2`), with a draft vocabulary
restricted to the 4096 tokens most frequent in the target's own rollouts, trained for T = 0.9
(`base.smollm2_drafter`: depths 1-3 unrolled, labels at T = 0.9, a total-variation term).

Run (the artifact is cached under .cache/drafter; `--ship` writes it into the package as the
drafter named `smollm2`, which every later run with this recipe loads instead of training):
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py \
      --depth=3 --ship=smollm2
The `teacher_forced` variant trains TLT's recipe (depth 1 only, labels at T = 1), for comparison;
`fused` the shipped recipe on EAGLE-3's fused features (the target's layers 2, 15 and 28 of 30
instead of its final hidden state) in our own layout; `eagle3` the same features in the EAGLE-3
layout of `speculators` (`drafter.model.architecture="eagle3"`, which vLLM serves exactly:
docs/SPECULATION.md), trained on the next token alone, as EAGLE-3 is (its `g` feeds the next step
before the output norm, so no feature regression); `eagle` the shipped recipe in vLLM's EAGLE-1
layout (`architecture="eagle"`: no `fc` bias, no input or output norm; the draft vocabulary
stays ours, which that layout cannot hold); `response` the shipped recipe with its loss on the
drafted positions alone (not the prompts'); `decay` the shipped recipe with its learning rate
decayed by a cosine to a tenth over its 400 steps. All train on the shipped drafter's rollouts (cached):
  python -m experiments.drafter_warmup \
      --config=experiments/configs/drafter_smollm2.py:teacher_forced
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py:fused \
      --depth=3
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py:eagle3 \
      --depth=3
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py:eagle \
      --depth=3
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py:response \
      --depth=3 --config.drafter.eval_prompts=16
  python -m experiments.drafter_warmup --config=experiments/configs/drafter_smollm2.py:decay \
      --depth=3 --config.drafter.eval_prompts=16
"""

import ml_collections

from experiments.configs import base


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  variants = ("", "teacher_forced", "fused", "eagle3", "eagle", "response", "decay", "small",
              "small_teacher_forced")
  if variant not in variants:
    raise ValueError(f"Unknown variant {variant!r}; use one of {variants}.")
  small = variant.startswith("small")
  c = base.smollm2_workload(small)
  c.name = "drafter_smollm2"
  c.drafter = base.smollm2_drafter(small, teacher_forced=variant.endswith("teacher_forced"))
  if variant in ("fused", "eagle3"):
    c.drafter.model.feature_layers = (2, 15, 28)
  if variant == "eagle3":
    c.drafter.model.architecture = "eagle3"
    c.drafter.model.smooth_l1_weight, c.drafter.model.ce_weight = 0.0, 1.0
  if variant == "eagle":
    c.drafter.model.architecture = "eagle"
  if variant == "response":
    c.drafter.warmup.prompt_loss = False
  if variant == "decay":
    c.drafter.train.decay_steps = c.drafter.warmup.steps
  c.drafter.eval_prompts = 2 if small else 8
  return c
