"""Prompt datasets, formatting and verifiable rewards (no model code here).

May import: models (the task's character tokenizer lives in `models/tokenizer.py`).
"""
