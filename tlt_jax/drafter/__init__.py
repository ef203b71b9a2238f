"""The EAGLE-style drafter: model, losses, training (warm-up on rollouts, buffer, spot trainer,
publishing) and `EagleProposer`, the engine's draft model.

May import: models, spec, rollout (warm-up rollouts, the engine it publishes to), checkpoint,
hashing, optim, typed.

Shape letters: the decoding layers' legend in `tlt_jax/spec/__init__.py`.
"""
