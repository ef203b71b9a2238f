"""Measurement helpers of the benchmark launchers (`experiments/bench_*.py`): the rollout engine
against a plain decode, speculative decoding against the plain engine, the adaptive drafter
against a frozen one, and the cost of a model step c(B, T). They sit above the library and are
not part of it: nothing in `tlt_jax` imports them."""
