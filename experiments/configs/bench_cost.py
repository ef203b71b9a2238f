"""Cost model: c(B, T) of one model step, plus this machine's bandwidth and compute floors.

Run:
  python -m experiments.bench_cost --config=experiments/configs/bench_cost.py            # tiny
  python -m experiments.bench_cost --config=experiments/configs/bench_cost.py:smollm2
The draft step of each drafter layout alone (SmolLM2's draft vocabulary):
  python -m experiments.bench_cost --config=experiments/configs/bench_cost.py:smollm2 \
      --config.batches='(1, 4, 16)' --config.tokens='(1,)' --config.drafter_vocabs='(4096,)' \
      --config.drafter_architectures='("tlt", "eagle", "eagle3")'
Small CPU variant (tests):
  python -m experiments.bench_cost --config=experiments/configs/bench_cost.py:small
"""

import ml_collections


def get_config(variant: str = "") -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = "tiny"
  c.batches = (1, 2, 4, 8, 16, 32, 64)
  c.tokens = (1, 2, 4, 8, 16)
  c.cache_len = 320
  c.iters = 10
  c.drafter_vocabs = (0,)          # 0: the full vocabulary; else a restricted draft vocabulary
  c.drafter_architectures = ("tlt",)  # the drafters' layouts priced (`DrafterConfig.architecture`)
  c.drafter_tokens = (1, 4)        # inputs per row of a draft step (a tree level feeds several)
  c.target_speedup = 1.8           # what speculation_bound asks of a chain (the SD target)
  c.suffix_depth, c.suffix_ngram = 3, 3  # the suffix arm priced (`suffix_d3_n3`)
  c.corpus_len = 256               # the suffix history's corpus before prompt and response
  if variant == "smollm2":
    c.drafter_vocabs = (0, 4096)
    c.drafter_tokens = (1, 5, 9)
    c.model = "smollm2"
    c.batches = (1, 2, 4, 8, 16, 32)
    c.tokens = (1, 4, 8, 16)
    c.cache_len = 512
    c.iters = 5
  elif variant == "small":
    c.batches, c.tokens, c.iters, c.cache_len = (1, 2), (1, 2), 2, 64
    c.drafter_tokens = (1,)
    c.drafter_architectures = ("tlt", "eagle3")
  elif variant:
    raise ValueError(f"Unknown variant {variant!r}; use '', 'smollm2' or 'small'.")
  return c
