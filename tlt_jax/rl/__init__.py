"""RL: learners behind one interface (GRPO, GSPO), the sharded update, the training loop with
its hooks and run records, a run config's sections turned into typed settings and the run built
from them, and run comparison.

May import every layer below: workloads, drafter, rollout, spec, models, sft, evaluation, tasks,
checkpoint, errors, hashing, optim, typed.
"""
