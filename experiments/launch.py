"""What every launcher shares: absl's `app.run`, with the libraries' INFO logs off.

A run prints its progress bars, its `[run]`/`[demo]` summary lines and warnings. orbax, jax and
absl log every checkpoint and compile at INFO; ask for them with `--verbosity=0` (absl's flag) or
`TLT_JAX_VERBOSITY=0` in the environment.
"""

import os

from absl import app, flags
from absl.logging import converter

_VERBOSITY_ENV = "TLT_JAX_VERBOSITY"


def run(main) -> None:
  """`app.run(main)` with warnings and errors only, unless the command line (`--verbosity`) or
  the environment asks for more. (`app.run` itself raises the level to INFO when the flag was not
  given, so the level is applied inside `main`.)"""
  value = os.environ.get(_VERBOSITY_ENV, str(converter.ABSL_WARNING))
  try:
    level = int(value)
  except ValueError:
    raise SystemExit(f"{_VERBOSITY_ENV}={value!r} is not an integer; use absl's levels "
                     "(-1 warnings, 0 info, 1 debug).") from None

  def quiet_main(argv):
    if not flags.FLAGS["verbosity"].present:
      flags.FLAGS.verbosity = level
    return main(argv)

  app.run(quiet_main)
