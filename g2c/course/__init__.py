"""Course tooling: the module registry, the solutions import hook, the notebook launcher
and the student progress view. Nothing here is a course exercise; course packages never
import this package (a test checks the import graph).

``from g2c.course import MODULES, get_module, parse_selection`` reads the registry.
"""

from .registry import (
    MODULES,
    REPO_ROOT,
    SOLUTIONS_ENV,
    SOLUTIONS_ROOT,
    CourseModule,
    dependents,
    get_module,
    grading_selection,
    module_for_file,
    module_ids,
    parse_selection,
    prerequisites,
    prerequisites_selector,
    selector_for,
)

__all__ = sorted(["MODULES", "REPO_ROOT", "SOLUTIONS_ENV", "SOLUTIONS_ROOT", "CourseModule", "get_module",
                  "dependents", "grading_selection", "module_for_file", "module_ids", "parse_selection",
                  "prerequisites", "prerequisites_selector", "selector_for"])
