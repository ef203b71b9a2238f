"""RL: learners behind one interface with hooks (GRPO, GSPO, DAPO), the sharded update, the
training loop with its hooks and run records, a run config's sections turned into typed settings
and the run built from them, and run comparison.

May import every layer below: workloads, drafter, rollout, spec, models, sft, evaluation, tasks,
checkpoint, errors, hashing, optim, typed.

Shape letters in this layer: R rows (responses), P prompts of G rows each (a prompt's rows are
contiguous), N response tokens per row, L columns (prompt bucket + N), V vocabulary.
"""
