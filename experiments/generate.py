"""Generates a completion with a real checkpoint or a preset.

  python -m experiments.generate --model=smollm2 --chat \
      --prompt="What is the capital of France?" --max_new_tokens=16 --temperature=0
`--dtype=bfloat16` keeps the weights and runs the matmuls and the KV cache in bf16 (norms,
softmax statistics and logits stay float32; on CPU float32 is the faster choice).
With --json the last line is one JSON object with `text` and `token_ids` (generated ids only).
`--prompts_file=FILE` decodes its prompts (one a line) as one batch; with --json the last line is
then `{"results": [{"prompt", "text", "token_ids"}, ...]}` (and `accept_len` with a drafter).
`--numerics=invariant` computes every position as any other call would (docs/SPECULATION.md,
"Invariant numerics"): then, in bf16 too, a drafter's output equals plain decoding's on every
prompt:
  python -m experiments.generate --model=smollm2 --chat --dtype=bfloat16 --numerics=invariant \
      --temperature=0.9 --seed=0 --prompts_file=P --max_new_tokens=128 --json [--drafter=smollm2]

Served with speculative decoding by a drafter (exact: the same output as without), shipped with
the package (`--drafter=smollm2`) or a `drafter_warmup` artifact directory; `--compare_plain`
also times plain decoding (each warm, the same engine layout) and adds `tokens_per_s`,
`plain_tokens_per_s` and `speedup` to the JSON:
  python -m experiments.generate --model=smollm2 --chat --drafter=smollm2 --compare_plain \
      --prompt="Tom has 3 apples and buys 5 more. How many now?" --temperature=0.9 --json
"""

import json
import time

import jax
from absl import app, flags

from experiments import launch
from tlt_jax.drafter.proposer import EagleProposer
from tlt_jax.drafter.warmup import load_any_drafter, resolve_drafter
from tlt_jax.models.config import NUMERICS
from tlt_jax.models.precision import DTYPES, Precision
from tlt_jax.models.pretrained import load_setting
from tlt_jax.models.sampling import SamplingParams
from tlt_jax.rollout.engine import EngineConfig, RolloutEngine
from tlt_jax.rollout.plain import generate_plain
from tlt_jax.spec.strategy import SpecConfig, Strategy

_MODEL = flags.DEFINE_string("model", "smollm2", "Preset name, HF checkpoint folder or .gguf file.")
_PROMPT = flags.DEFINE_string("prompt", None, "Prompt text.")
_PROMPTS_FILE = flags.DEFINE_string("prompts_file", None, "A file of prompts, one a line, "
                                    "decoded as one batch (instead of --prompt).")
_CHAT = flags.DEFINE_bool("chat", False, "Wrap the prompt as a user turn with the chat template.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate at most.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 is greedy.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus mass (1 is off).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Top-k (0 is off).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", DTYPES, "Weights, matmuls and KV cache dtype.")
_NUMERICS = flags.DEFINE_enum("numerics", "fast", NUMERICS, "invariant: every position's numbers "
                              "the same whatever the call computing them.")
_JSON = flags.DEFINE_bool("json", False, "End with one JSON line: text and token_ids.")
_DRAFTER = flags.DEFINE_string("drafter", None, "A shipped drafter's name (smollm2) or a drafter "
                               "artifact directory: serve with speculative decoding (exact: the "
                               "same output as without).")
_COMPARE = flags.DEFINE_bool("compare_plain", False, "With --drafter, also decode plainly: the "
                             "speedup, and whether the tokens are the same.")
_DEPTH = flags.DEFINE_integer("draft_depth", 4, "Draft depth (chain length or tree levels).")
_TREE = flags.DEFINE_list("draft_tree", None, "TOPK,NODES: draft an EAGLE-2 tree expanding the "
                          "TOPK best nodes per level and verifying the NODES best drafts "
                          "(default: a chain).")


def _timed(engine, prompts, params, seed):
  """The engine's completions and its wall seconds, the second of two calls (the first
  compiles)."""
  engine.generate(prompts, 1, params, jax.random.key(seed))
  t0 = time.perf_counter()
  res = engine.generate(prompts, 1, params, jax.random.key(seed))
  return [res.response(i) for i in range(len(prompts))], time.perf_counter() - t0


def generate(model, tok, prompts: list[list[int]], params: SamplingParams, seed: int = 0,
             drafter: str | None = None, depth: int = 4, tree: tuple[int, int] | None = None,
             compare_plain: bool = False) -> tuple[list[list[int]], dict]:
  """The completions' token ids of `prompts` (token ids, decoded as one batch), and with a
  drafter (`drafter`: a shipped drafter's name or an artifact directory; served with speculative
  decoding, a chain of `depth` or a `tree` of (topk, nodes)) its accepted length; with
  `compare_plain` also the speeds of both, each timed warm, and whether plain decoding gave the
  same tokens (`same_as_plain`)."""
  if not drafter:
    gen = generate_plain(model, prompts, jax.random.key(seed), params, pad_id=tok.pad_id)
    return [gen.response(i) for i in range(len(prompts))], {}
  module, _ = load_any_drafter(resolve_drafter(drafter), model)
  arm = (Strategy("tree", depth=depth, topk=tree[0], nodes=tree[1]) if tree
         else Strategy("eagle", depth=depth))
  spec = SpecConfig(threshold=len(prompts), arms=(arm,), min_accept_len=0.0)
  cfg = EngineConfig(batch_buckets=(len(prompts),), max_batch=len(prompts),
                     prefill_buckets=(max(16, *map(len, prompts)),))
  engine = RolloutEngine(model, cfg, pad_id=tok.pad_id, spec=spec, drafter=EagleProposer(module))
  if not compare_plain:
    res = engine.generate(prompts, 1, params, jax.random.key(seed))
    return ([res.response(i) for i in range(len(prompts))],
            {"accept_len": round(engine.spec.accept_len(), 3)})
  ids, sd_s = _timed(engine, prompts, params, seed)
  plain, plain_s = _timed(RolloutEngine(model, cfg, pad_id=tok.pad_id), prompts, params, seed)
  n = sum(map(len, ids))
  return ids, {"accept_len": round(engine.spec.accept_len(), 3),
               "tokens_per_s": round(n / sd_s, 2), "plain_tokens_per_s": round(n / plain_s, 2),
               "speedup": round(plain_s / sd_s, 3), "same_as_plain": plain == ids}


def _prompt_texts() -> list[str]:
  if (_PROMPT.value is None) == (_PROMPTS_FILE.value is None):
    raise app.UsageError("Give --prompt or --prompts_file (one prompt a line), not both.")
  if _PROMPT.value is not None:
    return [_PROMPT.value]
  try:
    with open(_PROMPTS_FILE.value) as f:
      texts = [line.rstrip("\n") for line in f if line.strip()]
  except OSError as e:
    raise app.UsageError(f"--prompts_file: {e}") from None
  if not texts:
    raise app.UsageError(f"--prompts_file={_PROMPTS_FILE.value} holds no prompt.")
  return texts


def main(argv):
  del argv
  texts = _prompt_texts()
  model, tok = load_setting("--model", _MODEL.value)
  model = Precision(param_dtype=_DTYPE.value, compute_dtype=_DTYPE.value,
                    numerics=_NUMERICS.value).apply(model)
  if _CHAT.value:
    if not tok.chat_template:
      raise app.UsageError(f"--chat: {_MODEL.value} has no chat template (a base model); leave "
                           "--chat out.")
    texts = [tok.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
  prompts = [tok.encode(t) for t in texts]
  longest = max(map(len, prompts))
  if longest + _MAX_NEW.value > model.cfg.max_seq_len:
    raise app.UsageError(f"Prompt of {longest} tokens + max_new_tokens {_MAX_NEW.value} "
                         f"exceeds the model context of {model.cfg.max_seq_len} tokens.")
  stops = tok.stop_ids  # eos and the ids of the checkpoint's generation_config.json
  try:
    params = SamplingParams(temperature=_TEMPERATURE.value, top_k=_TOP_K.value,
                            top_p=_TOP_P.value, max_new_tokens=_MAX_NEW.value, stop_tokens=stops)
  except ValueError as e:  # the message names the flag's setting
    raise app.UsageError(f"Sampling flags: {e}") from None
  if _TREE.value and len(_TREE.value) != 2:
    raise app.UsageError(f"--draft_tree takes TOPK,NODES, got {','.join(_TREE.value)}.")
  tree = tuple(int(x) for x in _TREE.value) if _TREE.value else None
  if _COMPARE.value and not _DRAFTER.value:
    raise app.UsageError("--compare_plain compares speculative decoding with plain: give "
                         "--drafter too.")
  try:
    drafter = resolve_drafter(_DRAFTER.value) if _DRAFTER.value else None
  except FileNotFoundError as e:
    raise app.UsageError(str(e)) from None
  ids, extra = generate(model, tok, prompts, params, _SEED.value, drafter, _DEPTH.value, tree,
                        _COMPARE.value)
  completions = [tok.decode(x) for x in ids]
  print("\n\n".join(completions))
  if not _JSON.value:
    return
  if _PROMPTS_FILE.value is None:
    print(json.dumps({"text": completions[0], "token_ids": ids[0], **extra}))
  else:
    print(json.dumps({"results": [{"prompt": p, "text": c, "token_ids": x}
                                  for p, c, x in zip(_prompt_texts(), completions, ids)],
                      **extra}))


if __name__ == "__main__":
  launch.run(main)
