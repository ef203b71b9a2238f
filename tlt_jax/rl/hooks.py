"""The parts of the RL loop that are not the step itself, as hooks the loop calls in order:
held-out evaluation, checkpoints, export and stopping the drafter's spot trainer.

Per step the loop calls `before_step` (its metrics join the step's), runs the step, calls
`after_step` (more metrics), writes the step's records, then `after_record` (what must follow
the records on disk: a checkpoint, so a resumed run never lacks a step's metrics). `at_end`
runs after the last step; `close` always runs, also after a fault.
"""

from __future__ import annotations

import numpy as np
from etils import epath

from tlt_jax import distributed
from tlt_jax.evaluation import group_stats
from tlt_jax.models.pretrained import save_pretrained
from tlt_jax.rl import resume
from tlt_jax.rl.metrics import RunWriter


class Hook:
  """A hook that does nothing at every point; hooks override the points they use."""

  def before_step(self, trainer) -> dict:
    """Metrics to join the coming step's (runs before it)."""
    return {}

  def after_step(self, trainer) -> dict:
    """Metrics to join the step's, after it ran."""
    return {}

  def after_record(self, trainer) -> None:
    """What must follow the step's records on disk."""
    pass

  def at_end(self, trainer, history: list[dict]) -> None:
    """After the last step, with this call's step records."""
    pass

  def close(self, trainer) -> None:
    """Always, when the loop ends (also after a fault)."""
    pass


class Evaluation(Hook):
  """Held-out accuracy every `every` steps from step 0 (`eval/...`), and after the last step
  (`eval/final_...`); each evaluation's per-prompt accuracy goes to the run's `eval.jsonl`."""

  def __init__(self, writer: RunWriter, every: int):
    self.writer, self.every = writer, every

  def _evaluate(self, trainer, final: bool) -> dict:
    metrics, per_prompt = evaluate(trainer)
    self.writer.evaluation(trainer.step, final, per_prompt)
    return metrics

  def before_step(self, trainer) -> dict:
    """Held-out figures at every `every`-th step, from step 0."""
    return self._evaluate(trainer, False) if trainer.step % self.every == 0 else {}

  def after_step(self, trainer) -> dict:
    """Held-out figures after the last step (`eval/final_...`)."""
    if trainer.step != trainer.steps:
      return {}
    return {k.replace("eval/", "eval/final_", 1): v
            for k, v in self._evaluate(trainer, True).items()}


_EVAL_KEY = 1_000_003  # folded into the run key for held-out evaluation: never a training key


def evaluate(trainer) -> tuple[dict, list[float]]:
  """Held-out accuracy of `trainer`'s current policy (a fixed key: the same samples' noise every
  time) with `evaluation.group_stats`' figures, and each held-out prompt's accuracy (what a
  paired before/after comparison needs)."""
  g = trainer.loop.eval_group_size
  res = trainer.generate(trainer.eval_prompts, g, trainer.key(_EVAL_KEY)).whole
  rewards = trainer.w.rewards(res, trainer.eval_answers, g)
  correct_NxG = (rewards >= 1.0).reshape(-1, g).astype(np.float32)
  stats = group_stats(correct_NxG, res.lengths)  # accuracy, lengths, mixed-reward groups
  return ({f"eval/{k}": v for k, v in stats.items()} | {"eval/reward": float(rewards.mean())},
          correct_NxG.mean(axis=1).tolist())


class Checkpoints(Hook):
  """A checkpoint every `every` steps and after the last; `close` waits for the last write."""

  def __init__(self, every: int):
    self.every = every

  def after_record(self, trainer) -> None:
    """A checkpoint every `every` steps and after the last."""
    if trainer.step % self.every == 0 or trainer.step == trainer.steps:
      resume.save(trainer)

  def close(self, trainer) -> None:
    """Waits for the last checkpoint's write."""
    trainer.ckpt.wait()


class Export(Hook):
  """The policy as a Hugging Face folder and, with an adaptive drafter, the drafter next to it
  (orbax + config; `experiments.generate --model=DIR/policy --drafter=DIR/drafter` reads them):
  every `every` steps into `out_dir/export/step_<N>` (0: never), and after the last step into
  `out_dir/export` when `final`."""

  def __init__(self, final: bool, every: int = 0):
    self.final, self.every = final, every

  def after_record(self, trainer) -> None:
    """An export at every `every`-th step before the last."""
    if self.every and trainer.step % self.every == 0 and trainer.step < trainer.steps:
      self._export(trainer, trainer.out_dir / "export" / f"step_{trainer.step}")

  def at_end(self, trainer, history: list[dict]) -> None:
    """The final export, when the run trained."""
    if history and self.final:
      directory, serving = self._export(trainer, trainer.out_dir / "export")
      if distributed.is_writer():
        served = (f" and drafter ({serving}/README.md: serving it in vLLM or SGLang)"
                  if serving else "")
        print(f"[trainer] exported the final policy{served} to {directory}")

  @staticmethod
  def _export(trainer, directory: epath.Path) -> tuple[epath.Path, str | None]:
    """Exports the policy (and the drafter); returns the folder and the drafter's serving
    folder's name (None without a drafter, or off the writing process)."""
    policy = trainer.updater.local_model()  # every process takes part in gathering it
    serving = None
    if distributed.is_writer():
      save_pretrained(policy, trainer.w.tokenizer, directory / "policy")
      if trainer.adaptive is not None:
        serving = trainer.adaptive.export(directory, policy, {"rl_step": trainer.step})
    return directory, serving


class StopSpotTraining(Hook):
  """Preempts the adaptive drafter's spot trainer when the loop ends, however it ends."""

  def close(self, trainer) -> None:
    """Preempts any open spot-training window."""
    trainer.adaptive.stop()


def loop_hooks(trainer, writer: RunWriter) -> list[Hook]:
  """The hooks `trainer`'s settings ask for, in the order they run."""
  hooks: list[Hook] = [StopSpotTraining()] if trainer.adaptive is not None else []
  if trainer.eval_prompts is not None and trainer.loop.eval_every > 0:
    hooks.append(Evaluation(writer, trainer.loop.eval_every))
  if trainer.ckpt is not None:
    hooks.append(Checkpoints(trainer.loop.checkpoint_every))
  if trainer.loop.export or trainer.loop.export_every:
    hooks.append(Export(trainer.loop.export, trainer.loop.export_every))
  return hooks
