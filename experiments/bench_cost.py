"""Prints c(B, T) for a model, the draft-step cost of an EAGLE drafter for it (full and restricted
draft vocabulary) and the suffix proposer's work per step, the machine's floors, and what
speculation must accept to reach the target speedup at each batch and depth
(`cost.speculation_bound`); last line one JSON object.

  python -m experiments.bench_cost --config=experiments/configs/bench_cost.py:smollm2
"""

import json
from math import nan

from ml_collections import config_flags

from experiments import launch
from tlt_jax.models.pretrained import load_policy
from tlt_jax.drafter.model import DrafterConfig, init_drafter
from experiments.benchmarks.cost import (cost_table, drafter_cost_table, machine_floors,
                                         matmul_only_cost, param_bytes, speculation_bound,
                                         suffix_cost_table)

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/bench_cost.py")


def main(argv):
  del argv
  c = _CONFIG.value
  if not c.target_speedup > 0:
    raise ValueError(f"target_speedup must be > 0, got {c.target_speedup}.")
  model = load_policy(c.model)
  floors = machine_floors()
  weights = param_bytes(model)
  floor_ms = 1e3 * weights / (floors["bandwidth_gb_s"] * 1e9)
  table = cost_table(model, c.batches, c.tokens, c.cache_len, c.iters)
  print(f"{c.model}: {weights / 1e6:.1f} MB of weights; bandwidth {floors['bandwidth_gb_s']} GB/s, "
        f"matmul {floors['matmul_gflop_s']} GFLOP/s; weight-read floor {floor_ms:.2f} ms/step")
  print("c(B, T): each batch's cells timed in alternating rounds; fastest call and median, ms")
  print("   B    T   fastest    median   us/row-token   c(B,T)/c(B,1)")
  base = {r["B"]: r["ms"] for r in table if r["T"] == 1}
  for r in table:
    ratio = r["ms"] / base.get(r["B"], nan)
    print(f"{r['B']:4d} {r['T']:4d} {r['ms']:9.3f} {r['ms_median']:9.3f} {r['us_per_token']:14.2f}"
          f" {ratio:15.2f}")
  # The same moment's split of c(B, 1): the step's matrix products alone, then everything else.
  # The step's products alone, and the same products on separate q/k/v and gate/up kernels, in
  # three alternating rounds; the fastest median of each.
  matmul_only, separate = {}, {}
  for b in c.batches:
    fused_s, sep_s = [], []
    for _ in range(3):
      fused_s.append(matmul_only_cost(model, b, c.iters))
      sep_s.append(matmul_only_cost(model, b, c.iters, fused=False))
    matmul_only[b], separate[b] = round(1e3 * min(fused_s), 3), round(1e3 * min(sep_s), 3)
  print("   B   c(B,1) ms   matrix products alone ms   x floor   rest of the step ms"
        "   separate q/k/v, gate/up ms   separate / fused")
  for b, ms in matmul_only.items():
    step = base.get(b, nan)
    print(f"{b:4d} {step:11.3f} {ms:26.3f} {ms / floor_ms:9.2f} {step - ms:21.3f}"
          f" {separate[b]:28.3f} {separate[b] / ms:18.3f}")
  drafter_tables = {}
  for arch, vocab in ((a, v) for a in c.drafter_architectures for v in c.drafter_vocabs):
    drafter = cost_drafter(model, vocab, arch)
    rows = drafter_cost_table(model, drafter, c.batches, c.drafter_tokens, c.cache_len, c.iters)
    name = (f"vocab_{len(drafter.cfg.vocab_ids) or model.cfg.vocab_size}"
            + ("" if arch == "tlt" else f"_{arch}"))
    drafter_tables[name] = rows
    print(f"drafter draft step, {name} ({param_bytes(drafter) / 1e6:.1f} MB of its own weights):")
    print("   B    T        ms   target c(B,1) in the same rounds   share")
    for r in rows:
      print(f"{r['B']:4d} {r['T']:4d} {r['ms']:9.3f} {r['target_ms']:34.3f} {r['share']:7.3f}")
  # The model-free proposer's work per step (the suffix arm's match, drafts and history update
  # over its corpus, prompt and response), against the decode step of the same rounds.
  suffix = suffix_cost_table(model, c.batches, c.suffix_depth, c.suffix_ngram,
                             c.corpus_len + c.cache_len, c.cache_len, c.iters)
  print(f"suffix proposal, depth {c.suffix_depth}, n-gram {c.suffix_ngram}, history "
        f"{c.corpus_len + c.cache_len} tokens:")
  print("   B        ms   target c(B,1) in the same rounds   share")
  for r in suffix:
    print(f"{r['B']:4d} {r['ms']:9.4f} {r['target_ms']:34.3f} {r['share']:7.4f}")
  # What a chain must accept to reach the target speedup, with the cheapest drafter measured
  # above (a chain's draft step feeds one input per row; its share of c(B, 1) from the rounds
  # that alternated it with the target's step) and with a model-free proposer.
  cheapest = min(drafter_tables.values(), key=lambda t: sum(r["share"] for r in t), default=[])
  draft_share = {r["B"]: r["share"] for r in cheapest if r["T"] == 1}
  bound = speculation_bound(table, draft_share, c.target_speedup)
  print(f"speculation needs, for {c.target_speedup}x over plain decoding (accepted tokens per "
        "step, bonus included; at most depth + 1):")
  print("   B  depth  verify/c(B,1)  draft/c(B,1)  needed: free proposer  drafter"
        "   ceiling: free  drafter")
  for r in bound:
    print(f"{r['B']:4d} {r['depth']:6d} {r['verify_x']:14.2f} {r.get('draft_x', nan):13.3f}"
          f" {r['accept_needed_free']:22.2f} {r.get('accept_needed_drafter', nan):8.2f}"
          f" {r['ceiling_free']:16.2f} {r.get('ceiling_drafter', nan):8.2f}")
  print(json.dumps({"model": c.model, "weight_bytes": weights, **floors,
                    "floor_ms_b1": round(floor_ms, 3), "table": table,
                    "matmul_only_ms": matmul_only, "matmul_only_separate_ms": separate,
                    "drafter": drafter_tables, "suffix": suffix, "speculation_bound": bound}))


def cost_drafter(model, vocab: int, architecture: str = "tlt"):
  """A drafter of the model's shape in `architecture`'s layout (its cost does not depend on its
  weights; "eagle3" fuses three target layers); `vocab` > 0 restricts its head to that many
  tokens."""
  ids = tuple(range(min(vocab, model.cfg.vocab_size))) if vocab else ()
  n = model.cfg.n_layers
  layers = (1, n // 2, n - 1) if architecture == "eagle3" else ()
  return init_drafter(model.cfg, DrafterConfig(draft_vocab=vocab, vocab_ids=ids,
                                               architecture=architecture, feature_layers=layers))


if __name__ == "__main__":
  launch.run(main)
