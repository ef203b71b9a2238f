"""Rollout: plain decoding, the decode state with its plain and speculative steps, and the engine
with its weight store, shards (sub-meshes), scheduler and executable pool.

May import: models, spec (proposers, strategies, verification, and the `DraftModel` interface,
which is all it knows of a learned proposer), hashing, typed.

Shape letters: the decoding layers' legend in `tlt_jax/spec/__init__.py`.
"""
