"""Writes docs/CONFIG.md, the reference of every config key (type, default, meaning), from the
dataclasses that hold the defaults (`tlt_jax.rl.schema.reference`); a test fails when the page is
stale.

  python -m experiments.config_reference
"""

import os

from tlt_jax.rl.schema import reference

PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                    "CONFIG.md")


if __name__ == "__main__":
  with open(PATH, "w") as f:
    f.write(reference())
  print(f"[config_reference] wrote {PATH}")
