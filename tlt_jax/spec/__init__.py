"""Speculative decoding: proposers, exact verification, strategies and their bandit."""
