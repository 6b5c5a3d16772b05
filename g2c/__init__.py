"""g2c: a test-driven course from tensors to speculative decoding.

Importing ``g2c`` installs the ``G2C_APPLY_SOLUTIONS`` hook (see ``g2c/course/hook.py``)
before any course module is loaded. Tools select the answer key from code with
``g2c.use_solutions("all")`` (before importing course modules).

Layout: the course packages (``nn``, ``training``, ``tokenizer``, ``embeddings``, ``lm``,
``attention``, ``transformer``, ``pretraining``, ``sampling``, ``specdec``, ...) hold the
exercises; ``g2c.course`` (registry, hook, launcher) and ``g2c.assets`` (artifacts, corpus,
recipes) are tooling.
"""

from .course.hook import install as _install
from .course.hook import use_solutions as _use_solutions

APPLIED_SOLUTIONS: list[str] = _install()


def use_solutions(selector: str) -> list[str]:
    """Apply the answer key for ``selector`` (see ``g2c.course.hook.use_solutions``).

    Returns the selected ids and updates ``g2c.APPLIED_SOLUTIONS``.

    Raises:
        ValueError: malformed selector. RuntimeError: a course module is already imported.
    """
    global APPLIED_SOLUTIONS
    APPLIED_SOLUTIONS = _use_solutions(selector)
    return APPLIED_SOLUTIONS


__all__ = ["APPLIED_SOLUTIONS", "use_solutions"]
