"""Rollout: sampling (the behaviour policy), plain decoding, and the rollout engine."""
