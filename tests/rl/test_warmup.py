"""After the trainer's warm-up no RL step builds an XLA program, whatever its prompts' lengths."""

import jax
import numpy as np
import pytest

from tests.rl.test_trainer import workload
from tlt_jax.drafter.adaptive import AdaptiveConfig
from tlt_jax.drafter.model import DrafterConfig, init_drafter
from tlt_jax.drafter.publish import PublishConfig
from tlt_jax.drafter.spot import SpotConfig
from tlt_jax.models.tokenizer import CharTokenizer
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.pool import use_compilation_cache
from tlt_jax.spec.strategy import SpecConfig, Strategy


@pytest.mark.slow  # a TLT run whose warm-up builds every program its steps reach
def test_no_step_compiles_after_warm_up(tmp_path):
  w = workload()
  w.tokenizer = CharTokenizer(w.model.cfg.vocab_size)
  rng = np.random.default_rng(3)  # mostly short prompts, a few long: steps need different buckets
  sizes = rng.choice([1, 2, 3, 4, 6, 8, 12, 14], size=32, p=[.2, .2, .2, .2, .08, .06, .03, .03])
  w.prompts = [rng.integers(3, 53, size=int(k)).tolist() for k in sizes]
  arms = (Strategy("eagle", 3, 0), Strategy("suffix", 2, 2), Strategy("plain", 1, 0))
  tr = Trainer(w, LoopConfig(str(tmp_path), steps=4, prompts_per_step=4, group_size=4,
                             eval_every=2, eval_group_size=2,
                             max_tokens_per_micro_batch=64),  # rows of 28 tokens: 2 to 8 a group
               engine_cfg=EngineConfig(prefill_buckets=(4, 8, 16), batch_buckets=(1, 4, 16),
                                       max_batch=16, steps_per_dispatch=3),
               # The KL term on: the reference's log-probs are programs of every width too.
               learner=GRPOConfig(kl_coef=0.05),
               optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10),
               spec=SpecConfig(threshold=16, arms=arms, min_accept_len=0.0),
               drafter=init_drafter(w.model.cfg, DrafterConfig(), seed=1),
               adaptive=AdaptiveConfig(
                   spot=SpotConfig(batch_rows=4, seq_len=16, budget_s=0.2, min_segments=4),
                   publish=PublishConfig(depth=3, min_ratio=0.0, seq_len=16), holdout_rows=4),
               eval_prompts=w.prompts[:6], eval_answers=[None] * 6)
  buckets = {min(b for b in (4, 8, 16) if b >= max(len(w.prompts[i]) for i in tr.batch_indices(s)))
             for s in range(4)}
  assert len(buckets) > 1  # the steps' prompts need different prefill buckets
  hist = tr.run(progress=False)
  assert tr.warmup_report["warmup_programs"] > 0
  assert max(m["spec/sd_on_fraction"] for m in hist) > 0 and hist[-1]["drafter/steps"] > 0
  assert [m["compile_events"] for m in hist] == [0, 0, 0, 0]


def test_the_compilation_cache_is_set_once_and_an_engine_keeps_its_programs_there(tmp_path,
                                                                               small_model):
  """Launchers set JAX's compilation cache once (`use_compilation_cache`): the config's directory,
  else the one the process already has (the demo's TLT run, after its baseline), else the run's
  cache directory. An engine whose config names none keeps its executables there, so a re-run
  demo loads the TLT run's programs instead of compiling them."""
  before = jax.config.jax_compilation_cache_dir
  try:
    jax.config.update("jax_compilation_cache_dir", None)
    assert use_compilation_cache("", str(tmp_path / "jax")) == str(tmp_path / "jax")
    assert use_compilation_cache("", str(tmp_path / "other")) == str(tmp_path / "jax")
    assert use_compilation_cache(str(tmp_path / "own"), "") == str(tmp_path / "own")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
    engine = RolloutEngine(small_model, EngineConfig(batch_buckets=(2,), max_batch=2))
    assert engine.programs.pool.cache_dir == tmp_path / "own" / "executables"
    named = EngineConfig(batch_buckets=(2,), max_batch=2, compile_cache_dir=str(tmp_path / "n"))
    assert RolloutEngine(small_model, named).programs.pool.cache_dir == tmp_path / "n" / "executables"
  finally:
    jax.config.update("jax_compilation_cache_dir", before)
