"""Import this first to run the course's code as a library, with the answer key applied.

    import g2c.course.solved  # noqa: F401  (before any course module)

Benchmarks and scripts use the reference solutions so they work on an untouched clone. Importing
this module selects every module's solution (``g2c.use_solutions("all")``) unless
``G2C_APPLY_SOLUTIONS`` is already set (a student timing their own code sets it, e.g. to ``01-11``),
and silences the banner unless ``G2C_QUIET`` is set. Where course modules are already imported
(e.g. inside a pytest run that loads a benchmark), the running selection is kept.
"""

from __future__ import annotations

import os

import g2c

from .hook import loaded_course_modules
from .registry import SOLUTIONS_ENV

os.environ.setdefault("G2C_QUIET", "1")
if not loaded_course_modules():
    g2c.use_solutions(os.environ.get(SOLUTIONS_ENV) or "all")
