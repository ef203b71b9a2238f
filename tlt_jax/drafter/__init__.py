"""The EAGLE-style drafter: model, losses, training from rollout hidden states."""
