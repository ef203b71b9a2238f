"""GRPO: advantages, the clipped policy loss, the sharded update step, and the training loop.

May import every layer below: workloads, drafter, rollout, spec, models, sft, evaluation, tasks,
checkpoint, optim.
"""
