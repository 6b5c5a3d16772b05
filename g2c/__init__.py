"""g2c: a test-driven course from tensors to speculative decoding.

Importing ``g2c`` installs the ``G2C_APPLY_SOLUTIONS`` hook (see ``g2c/_solutions.py``)
before any course module is loaded.
"""

from ._solutions import install as _install

APPLIED_SOLUTIONS: list[str] = _install()

__all__ = ["APPLIED_SOLUTIONS"]
