"""The GRPO loop: TLT (coupled SD) is the same run as the baseline; a resumed run continues the
same trajectory."""

import collections
import json
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.conftest import small_config
from tlt_jax.models import init_model
from tlt_jax.models.precision import Precision
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rl import pictures, resume
from tlt_jax.rl.grpo import GRPOConfig
from tlt_jax.rl.trainer import LoopConfig, Trainer
from tlt_jax.rl.update import OptimConfig
from tlt_jax.rollout.engine import EngineConfig
from tlt_jax.spec.strategy import SpecConfig, Strategy
from tlt_jax.workloads import Workload, per_row


class _Tok:
  pad_id = 0


def workload(seed=0):
  """A random model whose reward is whether token 7 appears: mixed rewards within groups."""
  m = init_model(small_config(tie_embeddings=False), seed=seed)
  m.lm_head.kernel[...] = m.lm_head.kernel[...] * 4.0
  rng = np.random.default_rng(1)
  prompts = [rng.integers(3, 53, size=int(rng.integers(2, 8))).tolist() for _ in range(32)]
  params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_tokens=(9,))
  return Workload(m, _Tok(), prompts, [None] * 32, params,
                  per_row(lambda ids, ans: float(7 in ids)))


def engine(**kw) -> EngineConfig:
  """The tests' rollout layout: 16 rows in two batch buckets, so that a warm-up builds few
  programs (compaction from 16 to 4 rows is still exercised)."""
  return EngineConfig(**{"precompile": False, "prefill_buckets": (16,), "batch_buckets": (4, 16),
                         "max_batch": 16, **kw})


def run(tmp_path, name, steps, spec=None, checkpoint_every=0):
  tr = Trainer(workload(), LoopConfig(str(tmp_path / name), steps, prompts_per_step=4,
                                      group_size=4, checkpoint_every=checkpoint_every),
               engine_cfg=engine(),
               learner=GRPOConfig(), optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10),
               spec=spec)
  return tr.run(progress=False)


KEYS = ("reward", "rollout/length_p50", "rollout/length_max", "train/loss", "train/grad_norm")
TOP_LEVEL = {"step", "reward", "step_s", "rollout_s", "compile_events"}
NAMESPACES = {"train", "rollout", "spec", "drafter", "eval", "time"}


def test_tlt_with_the_coupled_rule_is_the_same_run_as_the_baseline(tmp_path):
  base = run(tmp_path, "base", 3)
  tlt = run(tmp_path, "tlt", 3, SpecConfig(threshold=16, arms=(Strategy(depth=3),),
                                          min_accept_len=0.0))
  assert any(m["train/grad_norm"] > 0 for m in base)  # the policy really changes
  assert len({m["reward"] for m in base}) > 1 or base[0]["rollout/mixed_group_fraction"] > 0
  for a, b in zip(base, tlt):
    for k in KEYS:
      assert a[k] == pytest.approx(b[k], abs=1e-5), k
  assert max(m["spec/sd_on_fraction"] for m in tlt) > 0
  lines = (tmp_path / "tlt" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(l)["step"] for l in lines] == [0, 1, 2]
  assert list((tmp_path / "tlt" / "tb").iterdir())  # TensorBoard events written
  for m in base + tlt:  # every other key in a namespace, for TensorBoard's and W&B's groups
    assert TOP_LEVEL <= set(m)
    assert {k.split("/")[0] for k in set(m) - TOP_LEVEL} <= NAMESPACES, sorted(m)
  for draw in (pictures.reward_curves, pictures.rollout_anatomy):
    path = tmp_path / f"{draw.__name__}.png"
    draw(str(tmp_path / "base"), str(tmp_path / "tlt"), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_a_bf16_run_keeps_float32_masters_and_log_probs_within_a_bound(tmp_path):
  """bf16 compute over float32 master weights: the optimizer state is float32, the rollout runs
  on weights cast once per sync, the loss stays finite, and the trainer's recomputed log-probs
  (a full forward) match the rollout's (decode steps) within 0.05 nats (measured: ~5e-3; in
  float32 they agree to ~5e-7)."""
  w = workload()
  w.model = Precision(compute_dtype="bfloat16").apply(w.model)
  tr = Trainer(w, LoopConfig(str(tmp_path / "bf16"), 3, prompts_per_step=4, group_size=4),
               engine_cfg=engine(), learner=GRPOConfig(),
               optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10))
  history = tr.run(progress=False)
  assert all(np.isfinite(m["train/loss"]) and m["train/grad_norm"] > 0 for m in history)
  assert all(1e-4 < m["train/logprob_mismatch_max"] < 0.05 for m in history)  # bf16 ran; bounded
  floats = lambda tree: {x.dtype for x in jax.tree.leaves(tree) if x.dtype != np.int32}
  assert floats(tr.updater.params) == floats(tr.updater.opt_state) == {np.dtype("float32")}
  rollout = {x.dtype for x in jax.tree.leaves(tr.engine.weights.shard(0)[0]) if x.ndim >= 2}
  assert rollout == {jnp.dtype("bfloat16")}


def test_in_invariant_numerics_the_trainer_recomputes_the_rollouts_log_probs_bit_for_bit(
    tmp_path):
  """bf16 with `numerics="invariant"`, decode steps and chain verifies in the rollout: the
  update's full forward (inside the gradient program) gives every response token exactly the
  log-prob the rollout recorded, so the first update's importance ratios are exactly 1 (the
  test above, in "fast" numerics, sees the 1e-4..5e-2 that rounding leaves)."""
  w = workload()
  w.model = Precision(compute_dtype="bfloat16", numerics="invariant").apply(w.model)
  tr = Trainer(w, LoopConfig(str(tmp_path / "inv"), 2, prompts_per_step=4, group_size=4),
               engine_cfg=engine(), learner=GRPOConfig(),
               optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10),
               spec=SpecConfig(threshold=16, arms=(Strategy(depth=3),), min_accept_len=0.0))
  history = tr.run(progress=False)
  assert max(m["spec/sd_on_fraction"] for m in history) > 0
  assert [m["train/logprob_mismatch_max"] for m in history] == [0.0, 0.0]


def test_resume_continues_the_same_trajectory(tmp_path):
  straight = run(tmp_path, "straight", 3)
  run(tmp_path, "resumed", 2, checkpoint_every=1)
  resumed = run(tmp_path, "resumed", 3, checkpoint_every=1)
  assert len(resumed) == 1 and resumed[0]["step"] == 2
  for k in KEYS:
    assert resumed[0][k] == pytest.approx(straight[2][k], abs=1e-5), k


def test_held_out_evaluation_and_the_rollout_record(tmp_path):
  w = workload()
  tr = Trainer(w, LoopConfig(str(tmp_path), steps=3, prompts_per_step=4, group_size=4,
                             eval_every=2, eval_group_size=2),
               engine_cfg=engine(),
               learner=GRPOConfig(), optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10),
               eval_prompts=w.prompts[:6], eval_answers=[None] * 6)
  hist = tr.run(progress=False)
  assert [("eval/accuracy" in m) for m in hist] == [True, False, True]
  assert "eval/final_accuracy" in hist[-1] and 0.0 <= hist[-1]["eval/final_accuracy"] <= 1.0
  # Each evaluation's figures agree with its per-prompt accuracies (what the demo reports as the
  # task's properties): accuracy their mean, mixed-reward groups those strictly inside (0, 1).
  evals = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
  figures = [hist[0], hist[2], {k.replace("eval/final_", "eval/"): v for k, v in hist[-1].items()
                                if k.startswith("eval/final_")}]
  assert [e["step"] for e in evals] == [0, 2, 3] and len(evals[0]["per_prompt_accuracy"]) == 6
  for e, m in zip(evals, figures):
    acc = np.array(e["per_prompt_accuracy"])
    assert m["eval/accuracy"] == pytest.approx(acc.mean())
    assert m["eval/mixed_group_fraction"] == pytest.approx(np.mean((acc > 0) & (acc < 1)))
    assert m["eval/length_p50"] <= m["eval/length_p99"] <= m["eval/length_max"] <= 12
  assert any(0 < x < 1 for e in evals for x in e["per_prompt_accuracy"])
  for m in hist:
    assert 0.0 <= m["time/tail_s"] <= m["rollout_s"]
    assert m["rollout/accuracy"] == m["reward"]  # a 0/1 reward
  records = [json.loads(l) for l in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records] == [0, 1, 2]
  decode = [e for e in records[0]["events"] if e[1] == "decode"]
  assert decode and decode[0][5] == 16 and sum(e[7] for e in decode) > 0  # 16 live rows, tokens


def test_bad_trainer_settings_are_clear_errors(tmp_path):
  kw = dict(learner=GRPOConfig(), optim=OptimConfig(), engine_cfg=engine())
  with pytest.raises(ValueError, match="exceeds the prompt pool"):
    Trainer(workload(), LoopConfig(str(tmp_path), 1, prompts_per_step=99, group_size=4), **kw)
  with pytest.raises(ValueError, match="prefill bucket"):
    Trainer(workload(), LoopConfig(str(tmp_path), 1, prompts_per_step=4, group_size=4),
            **{**kw, "engine_cfg": engine(prefill_buckets=(4,))})
  with pytest.raises(ValueError, match="steps must be an integer >= 1"):
    LoopConfig(str(tmp_path), 0, prompts_per_step=4, group_size=4)


def test_the_kl_reference_survives_a_resume(tmp_path):
  """With kl_coef > 0 the frozen reference is checkpointed: a resumed run computes the KL term
  against the run's starting policy, not against the policy it resumed from."""
  kw = dict(engine_cfg=engine(),
            learner=GRPOConfig(kl_coef=0.1), optim=OptimConfig(lr=1e-2, warmup_steps=0,
                                                            total_steps=10))
  loop = lambda steps: LoopConfig(str(tmp_path), steps, prompts_per_step=4, group_size=4,
                                  checkpoint_every=1)
  first = Trainer(workload(), loop(2), **kw)
  hist = first.run(progress=False)
  assert hist[0]["train/kl"] < 1e-7 and hist[1]["train/kl"] > 1e-6
  again = Trainer(workload(seed=5), loop(3), **kw)  # another init: the reference must come back
  assert resume.restore(again)
  for a, b in zip(jax.tree.leaves(again.updater.ref_params),
                  jax.tree.leaves(first.updater.ref_params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _wandb_history(path, key: str, record_cls) -> tuple[list, collections.Counter]:
  """The values logged under `key` in an offline W&B run's record file, read with W&B's own
  protobuf `record_cls`: a 7-byte file header, then records cut into 32 KiB blocks,
  each piece behind a 7-byte header (crc, length, kind: 1 whole, 2 first, 3 middle, 4 last);
  and the count of each record type (what a failure shows)."""
  data, block, pos, buf, out = path.read_bytes(), 1 << 15, 7, b"", []
  kinds = collections.Counter()
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's tail too short for a header is padding
      pos += block - pos % block
      continue
    _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
    chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
    buf = chunk if kind in (1, 2) else buf + chunk
    if kind not in (1, 4):
      continue
    record = record_cls.FromString(buf)
    kinds[record.WhichOneof("record_type")] += 1
    for item in record.history.item if record.HasField("history") else ():
      if (item.key or "/".join(item.nested_key)) == key:  # W&B writes either field
        typed = item.WhichOneof("value")
        out.append(getattr(item, typed) if typed else json.loads(item.value_json))
  return out, kinds


def test_weights_and_biases_logs_offline_beside_the_records(tmp_path, monkeypatch):
  record_cls = pytest.importorskip("wandb.proto.wandb_internal_pb2").Record
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.delenv("WANDB_API_KEY", raising=False)
  out = tmp_path / "run"
  tr = Trainer(workload(), LoopConfig(str(out), 2, prompts_per_step=4, group_size=4,
                                      loggers=("wandb",)),
               engine_cfg=engine(), learner=GRPOConfig(),
               optim=OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10))
  hist = tr.run(progress=False)
  (record,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
  steps, kinds = _wandb_history(record, "_step", record_cls)
  for key in ("reward", "train/loss", "spec/accept_len"):
    logged = dict(zip(steps, _wandb_history(record, key, record_cls)[0]))
    assert logged == pytest.approx({m["step"]: m[key] for m in hist}), (key, dict(kinds))
  assert not (out / "tb").exists()  # only the loggers asked for
  with pytest.raises(ValueError, match=r"loggers \['mlflow'\] unknown"):
    LoopConfig(str(out), 1, 4, 4, loggers=("mlflow",))
