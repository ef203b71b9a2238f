"""tlt_jax: reasoning-RL (GRPO) with lossless speculative decoding in the rollout, in JAX."""

import os as _os

__version__ = "0.1.0"

# XLA:CPU proves that a step reads a KV-cache layer before updating it in place only with
# region-based copy insertion; without it every decode step copies each layer's cache twice
# (three times per iteration of a decode loop), which at batch 1 costs about as much as reading
# the weights of a small model. XLA reads its flags when jax first starts a backend, so this must
# run before the first computation (importing `tlt_jax` first suffices); a value already in
# XLA_FLAGS wins. Other backends ignore the flag.
_REGION_ANALYSIS = "--xla_cpu_copy_insertion_use_region_analysis"
if _REGION_ANALYSIS not in _os.environ.get("XLA_FLAGS", ""):
  _os.environ["XLA_FLAGS"] = f"{_os.environ.get('XLA_FLAGS', '')} {_REGION_ANALYSIS}=true".strip()
