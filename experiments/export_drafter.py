"""Exports a drafter in the layout that vLLM and SGLang serve beside its policy: EAGLE-1, or for
an "eagle3" drafter EAGLE-3 in the `speculators` format (`--format`: the drafter's own by default).

  python -m experiments.export_drafter --drafter=smollm2 --model=smollm2 --out=/tmp/smollm2_eagle

`--drafter`: a shipped drafter's name or an artifact directory (a `drafter_warmup` cache entry, or
a run's exported `drafter/`); `--model`: the policy it drafts for (a preset, an HF folder or a
.gguf file), against which the drafter is checked. The folder gets `config.json`,
`model.safetensors` and a README with the `vllm serve` and SGLang commands; what the served
drafter computes otherwise than ours (a "tlt" drafter's norms, a restricted draft vocabulary) is
printed, one line each (tlt_jax/drafter/serving.py).
"""

from absl import app, flags

from experiments import launch
from tlt_jax.drafter.serving import FORMATS, default_format, export_drafter
from tlt_jax.drafter.warmup import load_any_drafter, resolve_drafter
from tlt_jax.errors import ConfigError
from tlt_jax.models.pretrained import load_setting

_DRAFTER = flags.DEFINE_string("drafter", None, "A shipped drafter's name or an artifact "
                               "directory.", required=True)
_MODEL = flags.DEFINE_string("model", "smollm2", "The policy it drafts for: a preset, an HF "
                             "folder or a .gguf file.")
_OUT = flags.DEFINE_string("out", None, "The folder to write.", required=True)
_FORMAT = flags.DEFINE_enum("format", None, FORMATS, "The serving layout (default: the one "
                            "that holds the drafter: speculators for 'eagle3', else eagle).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  model, _ = load_setting("--model", _MODEL.value)
  try:
    drafter, _ = load_any_drafter(resolve_drafter(_DRAFTER.value), model)
  except (FileNotFoundError, ValueError) as e:
    raise ConfigError(f"--drafter={_DRAFTER.value}: {e}") from None
  fmt = _FORMAT.value or default_format(drafter)
  try:
    notes = export_drafter(drafter, _OUT.value, fmt, target=model)
  except ValueError as e:
    raise ConfigError(f"--format={fmt}: {e}") from None
  for note in notes:
    print(f"[export] note: {note}.")
  print(f"[export] {fmt} drafter written to {_OUT.value} (README.md: how to serve it)")


if __name__ == "__main__":
  launch.run(main)
