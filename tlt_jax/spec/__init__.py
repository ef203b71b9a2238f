"""Speculative decoding: proposers behind one interface and registered by name (the draft-model
interface, the suffix proposer), exact verification, strategies, their bandit and the health
monitor.

May import: models, errors, typed (config sections to typed settings).

Shape letters in this layer (spec, rollout, drafter; `models/config.py` has the model's own):
  B rows of a batch bucket, U distinct prompts of a prefill, P prompt bucket, T tokens of one
  target call, N response tokens per row (`max_new_tokens`), S cache slots, K drafts of a chain,
  E nodes of a draft tree (the root first), M tokens a step commits per row (at most K + 1),
  J positions scored at once, V vocabulary, R draft vocabulary, D model width, F the drafter's
  input features, H a row's context width (corpus and prompt), L positions of a training row,
  C rows of the drafter buffer's ring, W the drafter's catch-up window.
"""
