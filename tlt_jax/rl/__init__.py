"""GRPO: advantages, the clipped policy loss, and the sharded update step."""
