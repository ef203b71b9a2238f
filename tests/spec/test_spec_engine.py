"""Speculative decoding in the engine: exactness (greedy, coupled), distribution (rejection) with
wrong variants it must catch, truncation at stop tokens, and the health fallback."""

import dataclasses
import inspect
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import small_config
from tests.statistics import pooled_chi_square_pvalue
from tlt_jax.hashing import content_digest
from tlt_jax.models import init_model
from tlt_jax.models.sampling import SamplingParams, processed_logprobs
from tlt_jax.rollout import programs
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec import verify
from tlt_jax.spec.drafts import ChainDrafts, ChainProposer
from tlt_jax.spec.proposer import PROPOSERS, register
from tlt_jax.spec.strategy import SpecConfig, Strategy, strategy_from_tuple

STOPS = (7, 9, 11)
ARMS = (Strategy(depth=2), Strategy(depth=4, ngram=2), Strategy(depth=6, ngram=1))


def _prompts(n=5, seed=0, v=53):
  rng = np.random.default_rng(seed)
  return [rng.integers(3, v, size=int(rng.integers(2, 14))).tolist() for _ in range(n)]


def peaked_model(scale=3.0, **cfg):
  """A random untied model with a sharpened head: its continuations fall into cycles, so suffix
  drafts are often right and speculative steps accept several tokens."""
  m = init_model(small_config(tie_embeddings=False, **cfg), seed=0)
  m.lm_head.kernel[...] = m.lm_head.kernel[...] * scale
  return m


def _run(model, params, prompts, g, spec=None, key=0, **kw):
  base = dict(batch_buckets=(4, 16), max_batch=16, steps_per_dispatch=3,
              precompile=False)
  base.update(kw)
  eng = RolloutEngine(model, EngineConfig(**base), spec=spec)
  return eng.generate(prompts, g, params, jax.random.key(key), capture_hidden=True), eng


# For claims that do not depend on compaction (the greedy and coupled tests below compact): 8 rows
# or fewer in one bucket, half the programs of two.
ONE_BUCKET = dict(batch_buckets=(8,), max_batch=8)


@pytest.mark.parametrize("threshold,buckets,n,g", [
    (16, (1, 2, 4, 8, 16), 5, 2),   # speculating from the first step
    (4, (1, 2, 4, 8, 16), 8, 1),    # switching on mid-rollout, once 4 rows or fewer are live
    (16, (16,), 5, 2)])             # one bucket: no compaction
def test_greedy_sd_equals_plain_greedy(threshold, buckets, n, g):
  model = peaked_model()
  params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_tokens=STOPS)
  prompts = _prompts(n, seed=4)
  plain, _ = _run(model, params, prompts, g, batch_buckets=buckets)
  sd, eng = _run(model, params, prompts, g, SpecConfig(threshold=threshold, arms=ARMS),
                 batch_buckets=buckets)
  np.testing.assert_array_equal(sd.tokens, plain.tokens)
  np.testing.assert_array_equal(sd.lengths, plain.lengths)
  np.testing.assert_allclose(sd.logprobs, plain.logprobs, atol=1e-5)
  np.testing.assert_allclose(sd.hidden.to_host()[0], plain.hidden.to_host()[0], atol=1e-4)
  assert eng.spec.accept_len() > 1.2  # speculation really accepted tokens


@pytest.mark.parametrize("rule", ["coupled", "rejection"])
def test_greedy_is_the_temperature_zero_case_of_both_rules(rule):
  model = peaked_model()
  params = SamplingParams(temperature=0.0, max_new_tokens=16, stop_tokens=STOPS)
  plain, _ = _run(model, params, _prompts(3, 1), 2, **ONE_BUCKET)
  sd, _ = _run(model, params, _prompts(3, 1), 2, SpecConfig(threshold=16, rule=rule, arms=ARMS),
               **ONE_BUCKET)
  np.testing.assert_array_equal(sd.tokens, plain.tokens)


def test_coupled_equals_plain_sampling_token_for_token():
  model = peaked_model(scale=30.0)
  params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=24, stop_tokens=STOPS)
  prompts = _prompts(6, seed=2)
  plain, _ = _run(model, params, prompts, 2, key=11)
  sd, eng = _run(model, params, prompts, 2, SpecConfig(threshold=12, rule="coupled", arms=ARMS,
                                                       min_accept_len=0.0), key=11)
  np.testing.assert_array_equal(sd.tokens, plain.tokens)
  np.testing.assert_allclose(sd.logprobs, plain.logprobs, atol=1e-5)
  np.testing.assert_allclose(sd.hidden.to_host()[0], plain.hidden.to_host()[0], atol=1e-4)
  assert eng.spec.accept_len() > 1.1
  assert sd.timeline.summary()["sd_on_fraction"] > 0


# ---------------------------------------------------------------- rejection: distribution

V, NEW, N = 5, 3, 4000
_REAL_REJECTION = verify.verify_chain_rejection
PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]


def _exact_joint(model, params):
  """P(first NEW tokens) under plain sampling, by enumerating every sequence."""
  seqs = np.array(list(itertools.product(range(V), repeat=NEW)))
  full = jnp.asarray(np.concatenate([np.tile(PROMPT, (len(seqs), 1)), seqs], axis=1))
  logp = processed_logprobs(model(full).logits_BxTxV[:, len(PROMPT) - 1: -1], params)
  lp = jnp.take_along_axis(logp, jnp.asarray(seqs)[:, :, None], axis=2)[:, :, 0].sum(axis=1)
  return np.exp(np.asarray(lp))


def _sd_joint_counts(model, params, arms):
  eng = RolloutEngine(model, EngineConfig(batch_buckets=(N,), max_batch=N, steps_per_dispatch=4,
                                          precompile=False, prefill_buckets=(16,)),
                      spec=SpecConfig(threshold=N, rule="rejection", arms=arms,
                                      min_accept_len=0.0))
  res = eng.generate([PROMPT], N, params, jax.random.key(123))
  idx = np.ravel_multi_index(res.tokens[:, :NEW].T, (V,) * NEW)
  return np.bincount(idx, minlength=V ** NEW), eng


PARAMS = [SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=NEW),
          SamplingParams(temperature=0.7, top_k=3, max_new_tokens=NEW)]


@pytest.fixture(scope="module")
def vmodel():
  return peaked_model(scale=2.0, vocab_size=V)


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("depth", [1, 2])
def test_rejection_sd_matches_plain_sampling_in_distribution(vmodel, params, depth):
  """Chi-square over the joint of the first 3 tokens (cells with expected count < 5 pooled),
  4000 samples, fixed seed; the test passes at significance 1e-3."""
  counts, eng = _sd_joint_counts(vmodel, params, (Strategy(depth=depth, ngram=2),))
  assert eng.spec.accept_len() > 1.1  # drafts were really verified and kept
  assert pooled_chi_square_pvalue(counts, _exact_joint(vmodel, params)) > 1e-3


def _residual_from_p(logp, drafts, q, key, ids, t0):  # wrong: resample from p, not p - q
  n_acc, _ = _REAL_REJECTION(logp, drafts, q, key, ids, t0)
  j = jnp.minimum(n_acc, drafts.shape[1] - 1)
  lp_j = jnp.take_along_axis(logp, j[:, None, None], axis=1)[:, 0]
  resampled = jax.vmap(lambda lp, i, t, jj: jnp.argmax(lp + jax.random.gumbel(
      verify.stream_key(key, i, t + 1 + jj, verify.RESIDUAL_STREAM), lp.shape)))(
          lp_j, ids, t0, j).astype(jnp.int32)
  return n_acc, jnp.where(n_acc < drafts.shape[1], resampled, -1)


def _uniform_q(logp, drafts, q, key, ids, t0):  # wrong: q is not what the drafts came from
  return _REAL_REJECTION(logp, drafts, jnp.full_like(q, 1.0 / q.shape[-1]), key, ids, t0)


def _accept_all(logp, drafts, q, key, ids, t0):  # wrong: lossy acceptance
  n = jnp.full(drafts.shape[:1], drafts.shape[1], jnp.int32)
  return n, jnp.full_like(n, -1)


# A "bonus token drawn from q" bug cannot be written here: after a full accept the bonus is the
# next step's plain sample from p (see rollout/spec_step.py). Tree sibling-mass removal is tested in
# test_verify.py.
@pytest.mark.parametrize("wrong", [_residual_from_p, _uniform_q, _accept_all])
def test_the_distribution_test_catches_subtly_wrong_rules(vmodel, monkeypatch, wrong):
  """The same test, at depth 1, on three subtly wrong rules. The patched rule is part of the
  traced source, so the engine's executables are keyed by it too (else the suite's executable
  cache would hand back the real rule's programs)."""
  params = PARAMS[0]
  monkeypatch.setattr(verify, "verify_chain_rejection", wrong)
  source = programs.traced_source_digest()
  monkeypatch.setattr(programs, "traced_source_digest",
                      lambda: content_digest([source, inspect.getsource(wrong)]))
  counts, _ = _sd_joint_counts(vmodel, params, (Strategy(depth=1, ngram=2),))
  assert pooled_chi_square_pvalue(counts, _exact_joint(vmodel, params)) < 1e-3


def test_invariant_numerics_sample_the_distribution_of_fast_numerics(vmodel):
  """Invariant numerics change only how sums are rounded: the engine's plain samples in that
  mode follow the joint of the first 3 tokens computed by the same weights in "fast" numerics
  (chi-square as above, 4000 rows, p > 1e-3); against the joint at temperature 0.8 the same
  samples fail (p < 1e-3; noncentrality 200 on 124 degrees of freedom), so the test sees a
  change of that size."""
  params = PARAMS[0]
  model = peaked_model(scale=2.0, vocab_size=V, numerics="invariant")
  eng = RolloutEngine(model, EngineConfig(batch_buckets=(N,), max_batch=N, precompile=False,
                                          prefill_buckets=(16,)))
  res = eng.generate([PROMPT], N, params, jax.random.key(7))
  counts = np.bincount(np.ravel_multi_index(res.tokens[:, :NEW].T, (V,) * NEW),
                       minlength=V ** NEW)
  assert pooled_chi_square_pvalue(counts, _exact_joint(vmodel, params)) > 1e-3
  colder = dataclasses.replace(params, temperature=0.8)
  assert pooled_chi_square_pvalue(counts, _exact_joint(vmodel, colder)) < 1e-3


# ---------------------------------------------------------------- health

def test_a_useless_proposer_triggers_the_fallback_within_its_window():
  """On an unpeaked random model sampled at temperature 1 the suffix drafts almost never match:
  each arm is retired after `health_window` speculative row-steps, then decoding is plain."""
  model = init_model(small_config(), seed=0)
  params = SamplingParams(temperature=1.0, max_new_tokens=40)
  spec = SpecConfig(threshold=16, rule="coupled", arms=ARMS[:2], health_window=12)
  plain, _ = _run(model, params, _prompts(4, 3), 2, key=5, **ONE_BUCKET)
  sd, eng = _run(model, params, _prompts(4, 3), 2, spec, key=5, **ONE_BUCKET)
  assert eng.spec.health.fallback and len(eng.spec.health.events) == 2
  # each arm speculated for at most one window (+ one dispatch of the whole batch) before retiring
  assert sum(eng.spec.row_steps.values()) <= 2 * (12 + 8 * 3)
  np.testing.assert_array_equal(sd.tokens, plain.tokens)  # and nothing changed
  assert sd.timeline.summary()["spec"]["fallback"] is True


# ---------------------------------------------------------------- the plain arm

def test_the_plain_arm_competes_in_the_bandit_and_changes_no_token():
  """With a `plain` arm and a useless proposer the bandit measures both on the same reward; the
  output is plain sampling's, and once the proposer is retired decoding stays plain."""
  model = init_model(small_config(), seed=0)
  params = SamplingParams(temperature=1.0, max_new_tokens=40)
  arms = (Strategy(depth=4), Strategy("plain", 1, 0))
  spec = SpecConfig(threshold=16, rule="coupled", arms=arms, epsilon=1.0, health_window=1000)
  plain, _ = _run(model, params, _prompts(4, 3), 2, key=5)
  sd, eng = _run(model, params, _prompts(4, 3), 2, spec, key=5)
  np.testing.assert_array_equal(sd.tokens, plain.tokens)
  kinds = {e.kind for e in sd.timeline.events}
  assert "decode" in kinds and "spec:suffix_d4_n3" in kinds  # both arms were dispatched
  chooser = eng.spec.chooser  # the plain arm earned bandit rewards
  assert any(chooser.rewards(b, 1) for b in eng.cfg.batch_buckets)
  assert 1 not in eng.spec.health.retired  # and is never retired
  assert SpecConfig(arms=arms).max_written == 4
  with pytest.raises(ValueError, match="Unknown proposer"):
    Strategy("greedy")


def test_tree_arms_are_checked_and_sized():
  tree = strategy_from_tuple(("tree", 4, 3, 10))
  assert (tree.candidates, tree.verified("coupled"), tree.verified("rejection")) == (30, 10, 30)
  assert tree.written("coupled") == 10 and Strategy("tree", 5, topk=4, nodes=8).written("x") == 17
  assert SpecConfig(arms=(tree, Strategy(depth=6))).max_written == 10
  with pytest.raises(ValueError, match="nodes <= 30"):
    Strategy("tree", 4, topk=3, nodes=31)
  with pytest.raises(ValueError, match=r"\('tree', depth, topk, nodes\)"):
    strategy_from_tuple(("tree", 4, 3))


class RepeatProposer(ChainProposer):
  """A proposer in one class, as a user would add one: it drafts the row's next token again
  `depth` times (right whenever the target repeats itself). `ChainProposer` gives what every
  chain of `depth` drafts verifies and writes."""

  name, uses_draft_model, fields = "repeat", False, ("depth",)

  def check(self, arm):
    if arm.depth > 8:
      raise ValueError(f"A repeat arm drafts at most 8 tokens, got depth={arm.depth}.")

  def arm_name(self, arm):
    return f"repeat_d{arm.depth}"

  def draft(self, target, drafter, st, s0_B, arm, params, key, rule, live_B):
    tokens_BxK = jnp.repeat(s0_B[:, None], arm.depth, axis=1)
    return ChainDrafts(tokens_BxK, jnp.ones(tokens_BxK.shape, bool), None)


def test_a_registered_proposer_is_an_arm_and_decodes_exactly():
  with pytest.raises(ValueError, match="Unknown proposer 'repeat'"):
    Strategy("repeat", 2)
  register(RepeatProposer())
  try:
    arm = strategy_from_tuple(("repeat", 3))
    assert arm.name == "repeat_d3" and not arm.uses_drafter and arm.written("coupled") == 3
    with pytest.raises(ValueError, match="at most 8"):
      Strategy("repeat", 9)
    model = peaked_model()
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_tokens=STOPS)
    prompts = _prompts(5, seed=4)
    plain, _ = _run(model, params, prompts, 2, batch_buckets=(16,))
    sd, eng = _run(model, params, prompts, 2,
                   SpecConfig(threshold=16, arms=(arm,), min_accept_len=0.0),
                   batch_buckets=(16,))
    np.testing.assert_array_equal(sd.tokens, plain.tokens)
    np.testing.assert_allclose(sd.logprobs, plain.logprobs, atol=1e-5)
    assert eng.spec.summary()["accept_len_per_arm"]["repeat_d3"] >= 1.0  # the arm ran
  finally:
    PROPOSERS.pop("repeat")


class BigramProposer(ChainProposer):
  """A proposer with per-row state, as a user would add one: a table of the token that last
  followed each token in the row's context and response, built at prefill (`start`) and kept in
  step with what the row emits (`after_emit`); it drafts by walking the table from `s0`."""

  name, uses_draft_model, reads_context, fields = "bigram", False, True, ("depth",)

  def __init__(self, vocab: int):
    self.vocab = vocab

  def check(self, arm):
    pass

  def arm_name(self, arm):
    return f"bigram_d{arm.depth}"

  def start(self, context_BxH, len_B):
    b, h = context_BxH.shape
    pos_H = jnp.arange(h)
    has_next_BxH = pos_H[None] + 1 < len_B[:, None]
    last_BxV = jnp.full((b, self.vocab), -1, jnp.int32).at[
        jnp.arange(b)[:, None], jnp.where(has_next_BxH, context_BxH, self.vocab)].max(
            jnp.broadcast_to(pos_H, (b, h)), mode="drop")
    nxt_BxV = jnp.take_along_axis(context_BxH, jnp.clip(last_BxV + 1, 0, h - 1), axis=1)
    prev_B = jnp.take_along_axis(context_BxH, jnp.maximum(len_B - 1, 0)[:, None], axis=1)[:, 0]
    return {"next_BxV": jnp.where(last_BxV >= 0, nxt_BxV, -1), "prev_B": prev_B}

  def after_emit(self, state, tokens_BxM, keep_B):
    rows = jnp.arange(tokens_BxM.shape[0])
    nxt, prev = state["next_BxV"], state["prev_B"]
    for j in range(tokens_BxM.shape[1]):
      kept = j < keep_B
      nxt = nxt.at[rows, jnp.where(kept, prev, self.vocab)].set(tokens_BxM[:, j], mode="drop")
      prev = jnp.where(kept, tokens_BxM[:, j], prev)
    return {"next_BxV": nxt, "prev_B": prev}

  def draft(self, target, drafter, st, s0_B, arm, params, key, rule, live_B):
    nxt_BxV, tok_B, out = st.proposers[self.name]["next_BxV"], s0_B, []
    for _ in range(arm.depth):
      tok_B = jnp.take_along_axis(nxt_BxV, jnp.clip(tok_B, 0, self.vocab - 1)[:, None],
                                  axis=1)[:, 0]
      out.append(tok_B)
    tokens_BxK = jnp.stack(out, axis=1)
    valid_BxK = jnp.cumprod(tokens_BxK >= 0, axis=1).astype(bool)
    return ChainDrafts(jnp.maximum(tokens_BxK, 0), valid_BxK, None)


def test_a_proposer_keeps_its_own_state_through_emits_and_compaction():
  """The engine holds a proposer's state without knowing it: built from the rows' context,
  updated with every emitted token, compacted with the rows, and exact whatever it drafts."""
  model = peaked_model()
  register(BigramProposer(model.cfg.vocab_size))
  try:
    params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_tokens=STOPS)
    prompts = _prompts(5, seed=4)
    plain, _ = _run(model, params, prompts, 2)
    spec = SpecConfig(threshold=16, arms=(Strategy("bigram", 4),), min_accept_len=0.0)
    sd, eng = _run(model, params, prompts, 2, spec)
    np.testing.assert_array_equal(sd.tokens, plain.tokens)
    np.testing.assert_allclose(sd.logprobs, plain.logprobs, atol=1e-5)
    assert sum(e.kind == "compact" for e in sd.timeline.events) > 0
    # 1.26 here; a table that `after_emit` never updates drafts nothing right (1.0).
    assert eng.spec.summary()["accept_len_per_arm"]["bigram_d4"] > 1.15
  finally:
    PROPOSERS.pop("bigram")


def test_the_suffix_proposer_drafts_from_the_corpus_it_is_given():
  """A row's corpus (its prompt's earlier responses) is searched before its own text: given the
  greedy responses themselves, suffix drafts are nearly all accepted; the tokens never change."""
  model = peaked_model()
  params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_tokens=STOPS)
  prompts = _prompts(5, seed=4)
  plain, _ = _run(model, params, prompts, 1)
  spec = SpecConfig(threshold=16, arms=(Strategy(depth=6, ngram=3),), min_accept_len=0.0)
  bare, eng_bare = _run(model, params, prompts, 1, spec)
  corpus = {i: plain.response(i) for i in range(len(prompts))}
  eng = RolloutEngine(model, EngineConfig(batch_buckets=(1, 2, 4, 8, 16), max_batch=16,
                                          steps_per_dispatch=3, precompile=False), spec=spec)
  fed = eng.generate(prompts, 1, params, jax.random.key(0), corpus=corpus)
  for r in (bare, fed):
    np.testing.assert_array_equal(r.tokens, plain.tokens)
  accept = lambda e: e.spec.summary()["accept_len_per_arm"]["suffix_d6_n3"]
  assert accept(eng) > accept(eng_bare) and accept(eng) > 4.0
