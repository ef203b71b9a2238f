"""`ConfigError`: a run config with a bad key or value, found before any work. The launchers
print it as one line (no traceback): the user's mistake, not the program's."""


class ConfigError(ValueError):
  """A bad config setting; the message names the key (`config.<key>: ...`) and the fix."""
