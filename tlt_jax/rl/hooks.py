"""The parts of the RL loop that are not the step itself, as hooks the loop calls in order:
held-out evaluation, checkpoints, export and stopping the drafter's spot trainer.

Per step the loop calls `before_step` (its metrics join the step's), runs the step, calls
`after_step` (more metrics), writes the step's records, then `after_record` (what must follow
the records on disk: a checkpoint, so a resumed run never lacks a step's metrics). `at_end`
runs after the last step; `close` always runs, also after a fault.
"""

from __future__ import annotations

from tlt_jax import distributed
from tlt_jax.rl.metrics import RunWriter


class Hook:
  """A hook that does nothing at every point; hooks override the points they use."""

  def before_step(self, trainer) -> dict:
    return {}

  def after_step(self, trainer) -> dict:
    return {}

  def after_record(self, trainer) -> None:
    pass

  def at_end(self, trainer, history: list[dict]) -> None:
    pass

  def close(self, trainer) -> None:
    pass


class Evaluation(Hook):
  """Held-out accuracy every `every` steps from step 0 (`eval/...`), and after the last step
  (`final_eval/...`); each evaluation's per-prompt accuracy goes to the run's `eval.jsonl`."""

  def __init__(self, writer: RunWriter, every: int):
    self.writer, self.every = writer, every

  def _evaluate(self, trainer, final: bool) -> dict:
    metrics, per_prompt = trainer.evaluate()
    self.writer.evaluation(trainer.step, final, per_prompt)
    return metrics

  def before_step(self, trainer) -> dict:
    return self._evaluate(trainer, False) if trainer.step % self.every == 0 else {}

  def after_step(self, trainer) -> dict:
    if trainer.step != trainer.steps:
      return {}
    return {f"final_{k}": v for k, v in self._evaluate(trainer, True).items()}


class Checkpoints(Hook):
  """A checkpoint every `every` steps and after the last; `close` waits for the last write."""

  def __init__(self, every: int):
    self.every = every

  def after_record(self, trainer) -> None:
    if trainer.step % self.every == 0 or trainer.step == trainer.steps:
      trainer.save()

  def close(self, trainer) -> None:
    trainer.ckpt.wait()


class Export(Hook):
  """The final policy (and adaptive drafter) as loadable folders after the last step."""

  def at_end(self, trainer, history: list[dict]) -> None:
    if history and distributed.is_writer():
      print(f"[trainer] exported the final policy (and drafter) to "
            f"{trainer.export_artifacts()}")


class StopSpotTraining(Hook):
  """Preempts the adaptive drafter's spot trainer when the loop ends, however it ends."""

  def close(self, trainer) -> None:
    trainer.adaptive.spot.preempt()
