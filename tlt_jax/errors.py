"""The errors a user can act on, printed by the launchers as one line (no traceback): `ConfigError`,
a run config with a bad key or value found before any work; `TrainingError`, a run that stopped
on a fault."""


class ConfigError(ValueError):
  """A bad config setting; the message names the key (`config.<key>: ...`) and the fix."""


class TrainingError(RuntimeError):
  """The run stopped on a fault (e.g. a non-finite loss); the last good checkpoint is intact."""


def first_line(e: BaseException, limit: int = 300) -> str:
  """`e` in one line: its type and the first line of its message, at most `limit` characters."""
  return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"[:limit]
