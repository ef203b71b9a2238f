"""Rollout: plain decoding, the decode state with its plain and speculative steps, and the engine.

May import: models, spec (strategies, verification, and the `DraftModel` interface, which is all
it knows of a learned proposer).
"""
