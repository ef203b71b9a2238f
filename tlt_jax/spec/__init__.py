"""Speculative decoding: the draft-model interface, the suffix proposer, exact verification,
strategies, their bandit and the health monitor.

May import: models.
"""
