"""tlt_jax: reasoning-RL (GRPO) with lossless speculative decoding in the rollout, in JAX."""

__version__ = "0.1.0"
