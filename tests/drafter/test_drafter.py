"""The EAGLE drafter: cache decoding, training signal, and exact speculative decoding with it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import jit_forward, small_config
from tests.spec.test_spec_engine import PARAMS, PROMPT, V, _exact_joint, _prompts, peaked_model
from tests.statistics import pooled_chi_square_pvalue
from tlt_jax.drafter.losses import drafter_loss, smooth_l1, unroll
from tlt_jax.drafter.model import DrafterConfig, drafter_cache, init_drafter
from tlt_jax.drafter.proposer import EagleProposer, as_proposer
from tlt_jax.drafter.train import DrafterTrainConfig, DrafterTrainer, teacher_batch
from tlt_jax.drafter.warmup import draft_vocabulary, target_fingerprint
from tlt_jax.models import commit, init_model
from tlt_jax.models.sampling import SamplingParams, gumbel_noise, processed_logprobs
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.spec.controller import SpecController
from tlt_jax.spec.strategy import SpecConfig, Strategy

STOPS = (7, 9, 11)
EAGLE = (Strategy("eagle", depth=3), Strategy("eagle", depth=5))
V_MODEL = small_config().vocab_size
TREE = (Strategy("tree", depth=3, topk=2, nodes=5), Strategy("tree", depth=4, topk=3, nodes=12))


@pytest.mark.parametrize("layers,architecture", [((), "tlt"), ((0, 1, 2), "tlt"), ((), "eagle")])
def test_drafter_cache_decoding_equals_its_full_forward(layers, architecture):
  target = peaked_model()
  d = init_drafter(target.cfg, DrafterConfig(feature_layers=layers, architecture=architecture),
                   seed=1)
  emb = jax.random.normal(jax.random.key(0), (2, 9, 32))
  h = jax.random.normal(jax.random.key(1), (2, 9, 32))
  full, _ = jit_forward(d, emb, h)
  cache = drafter_cache(target.cfg, 2, 16)
  a, cache = jit_forward(d, emb[:, :5], h[:, :5], cache)
  cache = commit(cache, jnp.array([5, 5]))
  b, _ = jit_forward(d, emb[:, 5:], h[:, 5:], cache)
  np.testing.assert_allclose(jnp.concatenate([a, b], 1), full, atol=1e-5)


_TRAINED = {}  # one fit per target and settings in a test process; the tests only read them


def _trained_drafter(target, layers=(), steps=60, vocab=0, architecture="tlt"):
  """A drafter fitted to the target's own greedy rollouts (teacher forcing, TLT's loss); `vocab`
  > 0 restricts its draft head to the rollouts' most frequent tokens. Returns (drafter, first
  step's metrics, last step's metrics)."""
  key = (target_fingerprint(target), tuple(layers), steps, vocab, architecture)
  if key not in _TRAINED:
    _TRAINED[key] = _fit_drafter(target, layers, steps, vocab, architecture)
  return _TRAINED[key]


def _fit_drafter(target, layers, steps, vocab, architecture):
  params = SamplingParams(temperature=0.0, max_new_tokens=24)
  eng = RolloutEngine(target, EngineConfig(batch_buckets=(32,), max_batch=32, precompile=False))
  prompts = _prompts(16, seed=9)
  res = eng.generate(prompts, 2, params, jax.random.key(0))
  seqs = [prompts[i // 2] + res.response(i) for i in range(32)]
  toks = np.zeros((32, 40), np.int32)
  mask = np.zeros((32, 40), np.float32)
  for i, s in enumerate(seqs):
    toks[i, : len(s)], mask[i, : len(s)] = s, 1
  cfg = DrafterConfig(feature_layers=layers, draft_vocab=vocab, architecture=architecture,
                      vocab_ids=draft_vocabulary(toks, mask, vocab, V_MODEL) if vocab else ())
  trainer = DrafterTrainer(init_drafter(target.cfg, cfg, seed=2), target,
                           DrafterTrainConfig(lr=3e-3, warmup_steps=5))
  feats, hidden = teacher_batch(target, toks, cfg)
  first = trainer.step(jnp.asarray(toks), feats, hidden, jnp.asarray(mask))
  for _ in range(steps):
    last = trainer.step(jnp.asarray(toks), feats, hidden, jnp.asarray(mask))
  return trainer.drafter(), first, last


def test_training_lowers_the_loss_and_raises_agreement():
  _, first, last = _trained_drafter(peaked_model())
  assert last["loss"] < 0.7 * first["loss"]
  assert last["top1_agreement"] > first["top1_agreement"] + 0.2


_PLAIN = {}  # plain decoding's reference rollouts, by everything that decides them


def _run(model, params, prompts, g, spec=None, drafter=None, key=0, follow="lazy",
         buckets=(4, 16)):
  """A rollout (and its engine); plain ones (no `spec`) are made once per test process, since
  many tests compare against the same reference."""
  ref = (target_fingerprint(model), model.cfg, params, tuple(map(tuple, prompts)), g, key, follow,
         buckets)
  if spec is None and ref in _PLAIN:
    return _PLAIN[ref]
  eng = RolloutEngine(model, EngineConfig(batch_buckets=buckets, max_batch=16,
                                          steps_per_dispatch=3, precompile=False,
                                          drafter_follow=follow),
                      spec=spec, drafter=as_proposer(drafter))
  out = eng.generate(prompts, g, params, jax.random.key(key), capture_hidden=True), eng
  if spec is None:
    _PLAIN[ref] = out
  return out


@pytest.mark.parametrize("trained,layers,arms,architecture", [
    (False, (), EAGLE, "tlt"), (True, (), EAGLE, "tlt"), (True, (0, 1, 2), EAGLE, "tlt"),
    (False, (), TREE, "tlt"), (True, (), TREE, "tlt"), (True, (0, 1, 2), TREE, "tlt"),
    (True, (), EAGLE, "eagle"), (True, (0, 1, 2), TREE, "eagle3")])
def test_eagle_greedy_equals_plain_greedy(trained, layers, arms, architecture):
  """Untrained and trained drafters, EAGLE-3 fused features, chains and trees, the EAGLE-1
  layout vLLM serves (`architecture="eagle"`, which learns more slowly here: 150 steps) and the
  EAGLE-3 layout of `speculators` (`architecture="eagle3"`)."""
  target = peaked_model()
  drafter = (_trained_drafter(target, layers, 150 if architecture == "eagle" else 60,
                              architecture=architecture)[0] if trained
             else init_drafter(target.cfg, DrafterConfig(feature_layers=layers), seed=3))
  params = SamplingParams(temperature=0.0, max_new_tokens=24, stop_tokens=STOPS)
  prompts = _prompts(5, seed=4)
  # One batch bucket (fewest programs) but for EAGLE-3's tree, whose 10 rows compact to 4.
  buckets = (4, 16) if architecture == "eagle3" else (16,)
  plain, _ = _run(target, params, prompts, 2, buckets=buckets)
  sd, eng = _run(target, params, prompts, 2,
                 SpecConfig(threshold=16, arms=arms, min_accept_len=0.0), drafter,
                 buckets=buckets)
  np.testing.assert_array_equal(sd.tokens, plain.tokens)
  np.testing.assert_allclose(sd.logprobs, plain.logprobs, atol=1e-5)
  np.testing.assert_allclose(sd.hidden.to_host()[0], plain.hidden.to_host()[0], atol=1e-4)
  if trained:  # a drafter that follows the target's cache and features gets drafts accepted
    assert eng.spec.accept_len() > 1.1


def successor_model(dtype="float32", numerics="fast"):
  """A random untied model whose head, besides a random part of equal norm, scores the successor
  of the current token under a fixed permutation: its top-2 logit gaps are wide, so bfloat16's
  rounding seldom decides a token, and its continuations are easy to draft."""
  m = init_model(small_config(tie_embeddings=False, dtype=dtype, numerics=numerics), seed=0)
  emb_VxD = np.asarray(m.embed.embedding[...], np.float32)
  successor_DxV = np.zeros(emb_VxD.shape[::-1], np.float32)
  successor_DxV[:, np.random.default_rng(0).permutation(len(emb_VxD))] = (
      emb_VxD / np.linalg.norm(emb_VxD, axis=1, keepdims=True)).T
  random_DxV = np.asarray(m.lm_head.kernel[...], np.float32)
  m.lm_head.kernel[...] = jnp.asarray(
      3.0 * (successor_DxV + random_DxV / np.linalg.norm(random_DxV, axis=0, keepdims=True)))
  return m


def _path_margins(model, prompts, g, res, params, key):
  """Per row of `res` (a plain rollout): the smallest margin by which a token won along the row
  (top-2 gap of the log-probs, plus the row's Gumbel noise when sampling), and the largest
  difference between its recorded log-probs and those of one full forward pass over it (the
  rounding noise between a decode step and a many-token pass)."""
  rows = len(prompts) * g
  seqs = [prompts[i // g] + res.response(i) for i in range(rows)]
  toks_RxL = np.zeros((rows, max(map(len, seqs))), np.int32)
  for i, s in enumerate(seqs):
    toks_RxL[i, :len(s)] = s
  logits_RxLxV = model(jnp.asarray(toks_RxL)).logits_BxTxV
  margin_R, noise_R = np.zeros(rows), np.zeros(rows)
  for i in range(rows):
    p, r = len(prompts[i // g]), np.array(res.response(i))
    logp_NxV = np.asarray(processed_logprobs(logits_RxLxV[i, p - 1:p - 1 + len(r)], params))
    noise_R[i] = np.abs(logp_NxV[np.arange(len(r)), r] - res.logprobs[i, :len(r)]).max()
    if not params.greedy:
      logp_NxV = logp_NxV + np.asarray(gumbel_noise(
          jax.random.key(key), jnp.full(len(r), i), jnp.arange(len(r)), logp_NxV.shape[-1]))
    top2_Nx2 = np.sort(np.where(np.isfinite(logp_NxV), logp_NxV, -1e9), axis=-1)[:, -2:]
    margin_R[i] = (top2_Nx2[:, 1] - top2_Nx2[:, 0]).min()
  return margin_R, noise_R


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bf16_speculative_decoding_equals_bf16_plain_decoding(temperature):
  """bfloat16 compute and cache (float32 weights, float32 logits). A verify pass of T tokens and
  a decode step of 1 need not round alike, so a token is the same wherever it won by more than
  that noise: the claim is checked on every row whose tokens all won by over 4x the noise
  measured between plain decoding and a full pass (on the successor model, nearly all rows)."""
  target = successor_model("bfloat16")
  assert target(jnp.zeros((1, 2), jnp.int32)).logits_BxTxV.dtype == jnp.float32
  drafter = _trained_drafter(successor_model())[0]
  params = SamplingParams(temperature=temperature, max_new_tokens=24, stop_tokens=STOPS)
  prompts = _prompts(8, seed=5)
  plain, _ = _run(target, params, prompts, 2, key=3, buckets=(16,))
  sd, eng = _run(target, params, prompts, 2,
                 SpecConfig(threshold=16, rule="coupled", arms=(EAGLE[0], TREE[0]),
                            min_accept_len=0.0), drafter, key=3, buckets=(16,))
  margin_R, noise_R = _path_margins(target, prompts, 2, plain, params, key=3)
  safe_R = margin_R > 4 * noise_R.max()
  assert safe_R.mean() >= 0.75, (margin_R, noise_R.max())
  np.testing.assert_array_equal(sd.tokens[safe_R], plain.tokens[safe_R])
  np.testing.assert_allclose(sd.logprobs[safe_R], plain.logprobs[safe_R], atol=2e-2)
  assert eng.spec.accept_len() > 1.1


@pytest.mark.parametrize("temperature,arms", [(0.0, EAGLE[:1]), (1.0, EAGLE[:1]), (1.0, TREE[:1])],
                         ids=["chain-greedy", "chain-T1", "tree-T1"])
def test_bf16_speculative_decoding_in_invariant_numerics_equals_plain_decoding(temperature, arms):
  """In invariant numerics a chain or tree verify computes each position as a decode step does
  (`models/invariant.py`), so coupled SD in bfloat16 gives plain decoding's tokens on every row,
  however narrowly a token won, and the same recorded log-probs bit for bit (in fast numerics
  the logits of a verify and a decode step part: tests/models/test_invariant.py)."""
  target = successor_model("bfloat16", numerics="invariant")
  drafter = _trained_drafter(successor_model())[0]
  params = SamplingParams(temperature=temperature, max_new_tokens=24, stop_tokens=STOPS)
  prompts = _prompts(8, seed=5)
  plain, _ = _run(target, params, prompts, 2, key=3, buckets=(16,))
  sd, eng = _run(target, params, prompts, 2,
                 SpecConfig(threshold=16, rule="coupled", arms=arms, min_accept_len=0.0),
                 drafter, key=3, buckets=(16,))
  np.testing.assert_array_equal(sd.tokens, plain.tokens)
  np.testing.assert_array_equal(sd.lengths, plain.lengths)
  kept = np.arange(sd.logprobs.shape[1])[None] < np.asarray(plain.lengths)[:, None]
  np.testing.assert_array_equal(sd.logprobs[kept], plain.logprobs[kept])
  assert eng.spec.accept_len() > 1.1


@pytest.mark.slow  # SmolLM2 in bf16: plain, chain and tree programs at two temperatures (~2 min)
@pytest.mark.xla_default  # the claim under the flags users run
def test_smollm2_bf16_invariant_sd_with_the_shipped_drafter_gives_plain_tokens():
  """The real model and its shipped drafter: in bf16 and invariant numerics, chain and tree SD
  under `coupled` give plain decoding's tokens on every row of 4 held-out word problems, at
  T = 0.9 and greedy (in fast numerics about half of such rows part within 128 tokens:
  docs/BENCHMARKS.md, "Invariant numerics")."""
  from experiments.generate import generate
  from tlt_jax.models.precision import Precision
  from tlt_jax.models.pretrained import load_pretrained
  from tlt_jax.tasks.word_problems import WordProblemConfig, make_word_problems
  model, tok = load_pretrained("smollm2")
  model = Precision(param_dtype="bfloat16", compute_dtype="bfloat16",
                    numerics="invariant").apply(model)
  prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p.question}]))
             for p in make_word_problems(4, WordProblemConfig(), 7, "test")]
  for temperature in (0.9, 0.0):
    params = SamplingParams(temperature=temperature, max_new_tokens=32, stop_tokens=tok.stop_ids)
    plain, _ = generate(model, tok, prompts, params, seed=0)
    for tree in (None, (2, 8)):
      sd, info = generate(model, tok, prompts, params, 0, "smollm2", depth=3, tree=tree)
      assert sd == plain, (temperature, tree)
      assert info["accept_len"] > 1.5, (temperature, tree, info)


@pytest.mark.parametrize("arms", [EAGLE, TREE])
def test_eagle_coupled_equals_plain_sampling(arms):
  target = peaked_model(scale=8.0)
  drafter = _trained_drafter(target)[0]
  params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=24, stop_tokens=STOPS)
  prompts = _prompts(6, seed=2)
  plain, _ = _run(target, params, prompts, 2, key=11, buckets=(16,))
  sd, eng = _run(target, params, prompts, 2,
                 SpecConfig(threshold=12, rule="coupled", arms=arms, min_accept_len=0.0),
                 drafter, key=11, buckets=(16,))
  np.testing.assert_array_equal(sd.tokens, plain.tokens)
  np.testing.assert_allclose(sd.logprobs, plain.logprobs, atol=1e-5)
  assert eng.spec.accept_len() > 1.1


@pytest.mark.parametrize("arm", [Strategy("eagle", depth=2),
                                 Strategy("tree", depth=2, topk=2, nodes=6)])
def test_eagle_rejection_matches_plain_sampling_in_distribution(arm):
  """q is the drafter's processed distribution the drafts were drawn from; in a tree, siblings
  are i.i.d. draws from it and rejected siblings' mass is removed (recursive rejection)."""
  target = peaked_model(scale=2.0, vocab_size=V)
  drafter = init_drafter(target.cfg, DrafterConfig(), seed=4)
  params = PARAMS[0]
  n = 4000
  eng = RolloutEngine(target, EngineConfig(batch_buckets=(n,), max_batch=n, steps_per_dispatch=4,
                                           precompile=False, prefill_buckets=(16,)),
                      spec=SpecConfig(threshold=n, rule="rejection", min_accept_len=0.0,
                                      arms=(arm,)), drafter=EagleProposer(drafter))
  res = eng.generate([PROMPT], n, params, jax.random.key(321))
  idx = np.ravel_multi_index(res.tokens[:, :3].T, (V,) * 3)
  counts = np.bincount(idx, minlength=V ** 3)
  assert eng.spec.accept_len() > 1.1
  assert pooled_chi_square_pvalue(counts, _exact_joint(target, params)) > 1e-3


def test_a_random_drafter_triggers_the_health_fallback():
  """Greedy, so that agreement is not helped by shared noise (under `coupled`, a random drafter
  agrees with a flat target often: both take the Gumbel-max of the same noise)."""
  target = init_model_untied()
  drafter = init_drafter(target.cfg, DrafterConfig(), seed=5)
  params = SamplingParams(temperature=0.0, max_new_tokens=40)
  sd, eng = _run(target, params, _prompts(4, 3), 2,
                 SpecConfig(threshold=16, arms=EAGLE, health_window=12), drafter, key=5)
  assert eng.spec.health.fallback
  assert sum(eng.spec.row_steps.values()) <= 2 * (12 + 8 * 3)


def init_model_untied():
  return init_model(small_config(tie_embeddings=False), seed=0)


def test_draft_vocabulary_is_the_most_frequent_tokens():
  toks = np.array([[5, 5, 5, 2, 9, 9, 0], [9, 5, 2, 7, 7, 7, 7]])
  mask = np.array([[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]], np.float32)
  # counts under the mask: 5 x4, 9 x3, 2 x2, 7 x1 (the masked-out 7s and 0 do not count)
  assert draft_vocabulary(toks, mask, 3, 12) == (2, 5, 9)
  with pytest.raises(ValueError, match="increasing order"):
    DrafterConfig(draft_vocab=2, vocab_ids=(9, 5))


@pytest.mark.parametrize("arms", [EAGLE, TREE])
def test_a_restricted_draft_vocabulary_stays_exact(arms):
  """Greedy and coupled SD with a drafter whose head covers a third of the vocabulary equal plain
  decoding, and the drafter still gets drafts accepted."""
  target = peaked_model(scale=8.0)
  drafter = _trained_drafter(target, vocab=V_MODEL // 3)[0]
  assert drafter.restricted and len(drafter.cfg.vocab_ids) == V_MODEL // 3
  prompts = _prompts(6, seed=2)
  for params in (SamplingParams(temperature=0.0, max_new_tokens=24, stop_tokens=STOPS),
                 SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=24, stop_tokens=STOPS)):
    # One batch bucket: the 12 rows speculate from the first dispatch, with the fewest
    # programs (the claim does not depend on the buckets; compaction is tested elsewhere).
    plain, _ = _run(target, params, prompts, 2, key=11, buckets=(16,))
    sd, eng = _run(target, params, prompts, 2,
                   SpecConfig(threshold=12, rule="coupled", arms=arms, min_accept_len=0.0),
                   drafter, key=11, buckets=(16,))
    np.testing.assert_array_equal(sd.tokens, plain.tokens)
    assert eng.spec.accept_len() > 1.1


@pytest.mark.parametrize("arms", [EAGLE, TREE])
def test_a_lazy_drafter_catches_up_when_speculation_starts(arms):
  """Speculation switching on mid-rollout (8 rows, 3 live after 11 steps; threshold 3): the
  lazily-following drafter,
  fed what it missed from captured hidden states, drafts as well as one fed at every step, and
  both decode exactly."""
  target = peaked_model(scale=8.0)
  drafter = _trained_drafter(target)[0]
  params = SamplingParams(temperature=0.0, max_new_tokens=40, stop_tokens=STOPS)
  prompts = _prompts(8, seed=4)
  plain, _ = _run(target, params, prompts, 1)
  spec = SpecConfig(threshold=3, arms=arms, min_accept_len=0.0)
  accept = {}
  for follow in ("lazy", "eager"):
    sd, eng = _run(target, params, prompts, 1, spec, drafter, follow=follow)
    np.testing.assert_array_equal(sd.tokens, plain.tokens)
    accept[follow] = eng.spec.accept_len()
  assert accept["lazy"] > 1.05 and abs(accept["lazy"] - accept["eager"]) < 0.05


def test_only_the_first_drafting_dispatch_catches_a_lazy_drafter_up(monkeypatch):
  """The dispatches that feed a lazy drafter the plain steps' tokens are set apart, so that the
  cost chooser reports the arm's own speed beside that switching cost: one per wave, the first
  that drafts after plain steps; none when the drafter follows eagerly."""
  target = peaked_model(scale=8.0)
  drafter = _trained_drafter(target)[0]
  params = SamplingParams(temperature=0.0, max_new_tokens=40, stop_tokens=STOPS)
  reasons = []
  real = SpecController.record
  monkeypatch.setattr(SpecController, "record", lambda self, *a, apart="": reasons.append(
      apart) or real(self, *a, apart=apart))
  spec = SpecConfig(threshold=3, arms=EAGLE, min_accept_len=0.0)
  by_follow = {}
  for follow in ("lazy", "eager"):
    reasons.clear()
    _run(target, params, _prompts(8, seed=4), 1, spec, drafter, follow=follow)
    by_follow[follow] = list(reasons)
  lazy, eager = by_follow["lazy"], by_follow["eager"]
  assert len(lazy) > 2 and lazy[0] == "catch_up" and not any(lazy[1:])
  assert len(eager) > 2 and not any(eager)


@pytest.mark.parametrize("layers", [(), (0, 1, 2)])
def test_unrolled_training_depths_equal_cached_drafting(layers):
  """Depth j of `unroll` at index t is exactly what a chain drafted from t computes at depth j:
  the cache holding depth 1's entries of indices < t, then each depth fed the one before."""
  target = peaked_model()
  d = init_drafter(target.cfg, DrafterConfig(feature_layers=layers), seed=2)
  n, steps = 10, 3
  emb = jax.random.normal(jax.random.key(0), (2, n, 32))      # embeddings of x_0 .. x_9
  h = jax.random.normal(jax.random.key(1), (2, n - 1, 32))    # features at 0 .. 8 (projected)
  gs = unroll(d, emb, h, steps)
  assert [g.shape for g in gs] == [(2, n - 1, 32)] * steps
  for t in (0, 3, n - 1 - steps):
    cache = drafter_cache(target.cfg, 2, 32)
    if t:
      _, cache = jit_forward(d, emb[:, 1: t + 1], h[:, :t], cache)
      cache = commit(cache, jnp.array([t, t]))
    feat = h[:, t: t + 1]
    for j in range(1, steps + 1):
      feat, cache = jit_forward(d, emb[:, t + j: t + j + 1], feat, cache)
      cache = commit(cache, jnp.array([1, 1]))
      np.testing.assert_allclose(gs[j - 1][:, t], feat[:, 0], atol=1e-5)


def test_unrolled_loss_adds_deeper_depths_and_one_step_is_teacher_forcing():
  target = peaked_model()
  toks = jax.random.randint(jax.random.key(3), (2, 12), 0, V_MODEL)
  mask = jnp.ones((2, 12), bool).at[1, 9:].set(False)
  feats, hidden = teacher_batch(target, np.asarray(toks), DrafterConfig())
  base = init_drafter(target.cfg, DrafterConfig(ce_weight=0.5), seed=4)
  loss1, m1 = drafter_loss(base, target, toks, feats, hidden, mask)
  assert not any(k.startswith("top1_agreement_d") for k in m1)
  # The teacher-forced loss, written out: depth 1 alone.
  g, _ = base(target.embed_tokens(toks[:, 1:]), feats[:, :-1])
  m = (mask[:, 1:] & mask[:, :-1]).astype(jnp.float32)
  sl1 = jnp.sum(smooth_l1(g - hidden[:, 1:]).mean(-1) * m) / m.sum()
  np.testing.assert_allclose(m1["smooth_l1"], sl1, rtol=1e-5)
  # Unrolled over 3 depths with decay 0.5: depth 1's metrics are unchanged, depths 2 and 3 add
  # their agreement, and the loss is the weighted mean of the three depths' losses.
  d3 = init_drafter(target.cfg, DrafterConfig(ce_weight=0.5, unroll_steps=3, unroll_decay=0.5),
                    seed=4)  # the same weights: unrolling adds no parameters
  loss3, m3 = drafter_loss(d3, target, toks, feats, hidden, mask)
  np.testing.assert_allclose(m3["smooth_l1"], m1["smooth_l1"], rtol=1e-6)
  assert {"top1_agreement_d2", "top1_agreement_d3"} <= set(m3)
  assert np.isfinite(float(loss3)) and float(loss3) != pytest.approx(float(loss1))


def test_the_labels_are_the_target_s_own_distribution_whatever_the_drafter_s_layout():
  """The soft labels are the target's head over the draft vocabulary on its own final hidden
  states: the output norm an "eagle3" drafter's head reads (here far from the identity) never
  touches them, so its loss and its total variation are against the target itself."""
  target = peaked_model()
  toks = jax.random.randint(jax.random.key(3), (2, 12), 0, V_MODEL)
  mask = jnp.ones((2, 12), bool)
  layers = (0, target.cfg.n_layers - 1)
  for arch, fused in (("tlt", ()), ("eagle", ()), ("eagle3", layers)):
    cfg = DrafterConfig(ce_weight=1.0, architecture=arch, feature_layers=fused, draft_vocab=8,
                        vocab_ids=tuple(range(0, 16, 2)))
    d = init_drafter(target.cfg, cfg, seed=4)
    if d.norm is not None:
      d.norm.scale[...] = jnp.linspace(0.5, 3.0, target.cfg.d_model)
    feats, hidden = teacher_batch(target, np.asarray(toks), cfg)
    _, m = drafter_loss(d, target, toks, feats, hidden, mask)
    p = jax.nn.softmax(target.head(hidden[:, 1:])[..., 0:16:2], -1)
    g, _ = d(target.embed_tokens(toks[:, 1:]), d.project(feats[:, :-1]))
    q = jax.nn.softmax(d.logits(target, g), -1)
    np.testing.assert_allclose(m["total_variation"],
                               jnp.mean(0.5 * jnp.sum(jnp.abs(p - q), -1)), rtol=1e-5, err_msg=arch)


def test_labels_at_the_rollout_temperature_total_variation_and_acceptance_weighting():
  """The soft labels and the drafter's distribution are both taken at `label_temperature`; the
  `total_variation` metric is one minus the rejection rule's acceptance of a depth-1 draft,
  sum(min(p, q)); `tv_weight` adds it to the loss; `accept_weighting` only lowers the weight of
  depths 2.. (by the detached chance that the depths before were accepted)."""
  target = peaked_model()
  toks = jax.random.randint(jax.random.key(3), (2, 12), 0, V_MODEL)
  mask = jnp.ones((2, 12), bool)
  feats, hidden = teacher_batch(target, np.asarray(toks), DrafterConfig())
  cfg = DrafterConfig(ce_weight=0.5, label_temperature=0.7)
  d = init_drafter(target.cfg, cfg, seed=4)
  loss, m = drafter_loss(d, target, toks, feats, hidden, mask)
  g, _ = d(target.embed_tokens(toks[:, 1:]), feats[:, :-1])
  p = jax.nn.softmax(d.logits(target, hidden[:, 1:]) / 0.7, -1)
  logq = jax.nn.log_softmax(d.logits(target, g) / 0.7, -1)
  np.testing.assert_allclose(m["soft_ce"], jnp.mean(-jnp.sum(p * logq, -1)), rtol=1e-5)
  accept = jnp.mean(jnp.sum(jnp.minimum(p, jnp.exp(logq)), -1))
  np.testing.assert_allclose(m["total_variation"], 1.0 - accept, rtol=1e-5)
  at_one, _ = drafter_loss(init_drafter(target.cfg, DrafterConfig(ce_weight=0.5), seed=4),
                           target, toks, feats, hidden, mask)
  assert float(at_one) != pytest.approx(float(loss))  # the temperature changes the labels
  with_tv, m_tv = drafter_loss(
      init_drafter(target.cfg, DrafterConfig(ce_weight=0.5, label_temperature=0.7, tv_weight=2.0),
                   seed=4), target, toks, feats, hidden, mask)
  np.testing.assert_allclose(with_tv, loss + 2.0 * m["total_variation"], rtol=1e-5)
  unrolled = dict(ce_weight=0.5, unroll_steps=3)
  plain3, m3 = drafter_loss(init_drafter(target.cfg, DrafterConfig(**unrolled), seed=4),
                            target, toks, feats, hidden, mask)
  weighted3, w3 = drafter_loss(
      init_drafter(target.cfg, DrafterConfig(**unrolled, accept_weighting=True), seed=4),
      target, toks, feats, hidden, mask)
  np.testing.assert_allclose(w3["soft_ce"], m3["soft_ce"], rtol=1e-6)  # depth 1 is unchanged
  assert float(weighted3) < float(plain3)
  with pytest.raises(ValueError, match="label_temperature"):
    DrafterConfig(label_temperature=0.0)


def test_unroll_config_is_checked():
  with pytest.raises(ValueError, match="unroll_steps"):
    DrafterConfig(unroll_steps=0)
  with pytest.raises(ValueError, match="unroll_decay"):
    DrafterConfig(unroll_decay=0.0)
