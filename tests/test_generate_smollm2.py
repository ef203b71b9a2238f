"""The generation CLI on the real SmolLM2 weights (slow)."""

import pytest

from tests.test_launchers import last_json, run_module


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france():
  out = last_json(run_module("experiments.generate", "--model=smollm2", "--chat",
                             "--prompt=What is the capital of France?", "--max_new_tokens=16",
                             "--temperature=0", "--json"))
  assert "Paris" in out["text"]
