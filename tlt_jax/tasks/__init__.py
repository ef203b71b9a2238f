"""Prompt datasets, formatting and verifiable rewards (no model code here)."""
