"""Verification rules against closed-form probabilities, and the wrong variants they exclude."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.statistics import chi_square_pvalue
from tlt_jax.spec import verify

P = jnp.array([0.5, 0.25, 0.15, 0.1, 0.0])
Q = jnp.array([0.1, 0.5, 0.2, 0.1, 0.1])
N = 20000


def _chain1_outcomes(p, q, draft_q=None):
  """One-draft chains for N independent rows: drafts ~ draft_q (default q), verified with q."""
  draft_q = q if draft_q is None else draft_q
  ids = jnp.arange(N)
  key = jax.random.key(0)
  drafts = jax.vmap(lambda i: jax.random.categorical(
      verify.stream_key(key, i, 1, verify.DRAFT_STREAM), jnp.log(draft_q)))(ids).astype(jnp.int32)
  logp = jnp.broadcast_to(jnp.log(p), (N, 1, 5))
  n_acc, forced = verify.verify_chain_rejection(
      logp, drafts[:, None], jnp.broadcast_to(q, (N, 1, 5)), key, ids, jnp.zeros(N, jnp.int32))
  out = jnp.where(n_acc == 1, drafts, forced)
  return np.asarray(n_acc), np.bincount(np.asarray(out), minlength=5)


def test_rejection_acceptance_rate_and_output_distribution_are_exact():
  n_acc, counts = _chain1_outcomes(P, Q)
  accept = float(jnp.sum(jnp.minimum(P, Q)))  # closed form: sum_x min(p(x), q(x))
  assert abs(n_acc.mean() - accept) < 4 * np.sqrt(accept * (1 - accept) / N)
  assert chi_square_pvalue(counts, P) > 1e-3


def test_rejection_with_wrong_q_is_detected():
  """q taken from another distribution than the drafts' (e.g. the unprocessed one) is wrong."""
  _, counts = _chain1_outcomes(P, jnp.array([0.2, 0.2, 0.2, 0.2, 0.2]), draft_q=Q)
  assert chi_square_pvalue(counts, P) < 1e-6


def test_point_mass_drafts_accept_with_probability_p():
  ids = jnp.arange(N)
  drafts = jnp.full((N, 1), 1, jnp.int32)
  n_acc, forced = verify.verify_chain_rejection(
      jnp.broadcast_to(jnp.log(P), (N, 1, 5)), drafts, verify.point_mass(drafts, 5),
      jax.random.key(1), ids, jnp.zeros(N, jnp.int32))
  assert abs(float(n_acc.mean()) - 0.25) < 4 * np.sqrt(0.25 * 0.75 / N)
  out = np.where(np.asarray(n_acc) == 1, 1, np.asarray(forced))
  assert chi_square_pvalue(np.bincount(out, minlength=5), P) > 1e-3


def test_coupled_chain_keeps_drafts_equal_to_the_targets_own_samples():
  logp = jnp.log(jnp.broadcast_to(P, (3, 4, 5)))
  key, ids, t0 = jax.random.key(2), jnp.arange(3), jnp.array([0, 5, 9])
  pos = t0[:, None] + 1 + jnp.arange(4)[None]
  target = verify.coupled_targets(logp, key, ids, pos, greedy=False)
  drafts = target.at[1, 2].set((target[1, 2] + 1) % 5).at[2, 0].set((target[2, 0] + 1) % 5)
  n_acc, forced = verify.verify_chain_coupled(logp, drafts, key, ids, t0, greedy=False)
  np.testing.assert_array_equal(n_acc, [4, 2, 0])
  np.testing.assert_array_equal(forced, [-1, -1, -1])
  greedy_n, _ = verify.verify_chain_coupled(logp, jnp.zeros((3, 4), jnp.int32), key, ids, t0, True)
  np.testing.assert_array_equal(greedy_n, [4, 4, 4])  # argmax of P is token 0


def _tree_outcomes(p):
  """Root with two point-mass children (tokens 0 and 1), both verified at depth 1."""
  ids = jnp.arange(N)
  tokens = jnp.broadcast_to(jnp.array([4, 0, 1]), (N, 3))
  parents = jnp.broadcast_to(jnp.array([-1, 0, 0]), (N, 3))
  q = verify.point_mass(tokens, 5)
  logp = jnp.broadcast_to(jnp.log(p), (N, 3, 5))
  path, n_acc, forced = verify.verify_tree(logp, tokens, parents, q, jax.random.key(3), ids,
                                           jnp.zeros(N, jnp.int32), rule="rejection",
                                           greedy=False, depth=1)
  chosen = np.asarray(tokens)[np.arange(N), np.asarray(path[:, 1])]
  out = np.where(np.asarray(n_acc) == 1, chosen, np.asarray(forced))
  return np.bincount(out, minlength=5)


def test_tree_recursive_rejection_is_exact():
  assert chi_square_pvalue(_tree_outcomes(P), P) > 1e-3


def test_tree_without_sibling_mass_removal_is_detected():
  """Trying the second sibling against the unchanged p (the first sibling's mass not removed)
  under-produces the second sibling's token."""
  counts = _tree_outcomes_no_removal()
  assert chi_square_pvalue(counts, P) < 1e-6


def _tree_outcomes_no_removal():
  rng = np.random.default_rng(0)
  p = np.asarray(P)
  out = np.empty(N, int)
  for r in range(N):  # the subtly wrong rule, written out: siblings 0 then 1 against the same p
    if rng.random() < p[0]:
      out[r] = 0
    elif rng.random() < p[1]:
      out[r] = 1
    else:
      res = p.copy()
      res[0] = 0.0  # only the last rejected sibling removed
      res[1] = 0.0
      out[r] = rng.choice(5, p=res / res.sum())
  return np.bincount(out, minlength=5)


def test_coupled_tree_follows_the_target_sample():
  logp = jnp.log(jnp.broadcast_to(P, (1, 4, 5)))
  key = jax.random.key(4)
  target = int(verify.coupled_targets(logp[:, :1], key, jnp.array([0]), jnp.array([[1]]),
                                      greedy=False)[0, 0])
  other = (target + 1) % 5
  tokens = jnp.array([[0, other, target, 3]])
  parents = jnp.array([[-1, 0, 0, 2]])
  path, n_acc, _ = verify.verify_tree(logp, tokens, parents, verify.point_mass(tokens, 5), key,
                                      jnp.array([0]), jnp.array([0]), rule="coupled",
                                      greedy=False, depth=2)
  assert int(path[0, 1]) == 2 and int(n_acc[0]) >= 1
