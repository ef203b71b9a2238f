"""Speculative decoding: proposers behind one interface and registered by name (the draft-model
interface, the suffix proposer), exact verification, strategies, their bandit and the health
monitor.

May import: models, errors, typed (config sections to typed settings).
"""
