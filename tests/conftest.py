"""Shared test configuration.

Tests that need the trained StoryLM ladder carry ``@pytest.mark.ladder``. When the
artifacts are missing they skip with a message naming the command that fetches them; with
``G2C_REQUIRE_ARTIFACTS=1`` (CI, once the artifacts ship) they fail instead.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from hypothesis import settings

try:
    from g2c.transformer.config import LADDER as LADDER_CONFIGS
except ValueError as exc:   # g2c.course.hook.SelectorError: a malformed G2C_APPLY_SOLUTIONS, one line, no traceback
    if type(exc).__name__ != "SelectorError":
        raise
    raise SystemExit(f"g2c: error: {exc}") from None   # pytest.exit would print as a conftest ImportError

# `pytest -n N` (xdist) run by hand: each worker takes its share of the cores as torch threads, as
# ./test.sh arranges with OMP_NUM_THREADS (g2c.course.progress.share_cores): N workers at torch's default of
# a thread per core oversubscribe the CPU (the fake-device suite ran 3-4x slower on 2 cores). A chosen
# OMP_NUM_THREADS is kept; subprocesses the tests start inherit the value.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1) > 1 and "OMP_NUM_THREADS" not in os.environ:
    import torch

    from g2c.course.progress import share_cores

    torch.set_num_threads(share_cores(int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# Property tests draw the same examples on every run (determinism: the pristine contract counts them).
settings.register_profile("g2c", derandomize=True)
settings.load_profile("g2c")

REPO_ROOT = Path(__file__).resolve().parent.parent
LADDER = tuple(LADDER_CONFIGS)  # names, from the one definition in module 09
LADDER_MISSING = (
    "StoryLM ladder artifacts missing: run ./checkpoints.sh (or ./checkpoints.sh --train to retrain)"
)


def ladder_artifacts() -> tuple[str, ...]:
    """The models the ``ladder`` marker needs: the ladder and the drafters trained against it."""
    from g2c.assets.artifacts import DRAFTERS

    return LADDER + tuple(DRAFTERS)


def ladder_paths(root: Path = REPO_ROOT) -> list[Path]:
    """The weight files every ladder test needs: the ladder's and the shipped drafters'."""
    return [root / "artifacts" / "models" / name / "model.safetensors" for name in ladder_artifacts()]


def require_ladder(root: Path = REPO_ROOT) -> None:
    """Skip (or fail, under ``G2C_REQUIRE_ARTIFACTS=1``) unless the StoryLM ladder is present."""
    missing = [p for p in ladder_paths(root) if not p.is_file()]
    if not missing:
        return
    msg = f"{LADDER_MISSING} (not found: {', '.join(p.relative_to(root).as_posix() for p in missing)})"
    if os.environ.get("G2C_REQUIRE_ARTIFACTS", "") == "1":
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # A hook rather than a fixture: it runs before any (module-scoped) fixture loads a model.
    if item.get_closest_marker("ladder") is not None:
        require_ladder()


REPLACE_EDITED = "G2C_REPLACE_EDITED"


@functools.cache
def _solutions_lines() -> tuple[str, ...]:
    """Whose code runs: the modules served from the answer key."""
    import g2c
    from g2c.course import SOLUTIONS_ENV

    if not g2c.APPLIED_SOLUTIONS:
        return ()
    return (f"g2c: reference solutions applied for modules {', '.join(g2c.APPLIED_SOLUTIONS)} "
            f"({SOLUTIONS_ENV}={os.environ.get(SOLUTIONS_ENV, '')!r})",)


def replaced_own_work_message(applied: list[str], worked: list[str], running: list[str] = ()) -> str | None:
    """The one-line refusal when the answer key would replace a module the student edited *whose tests run*,
    else None.

    ``running``: the modules whose test files this run selects. A selected test file grades its own module;
    the answer key may stand in for that module's prerequisites, edited or not (the seed's
    ``G2C_APPLY_SOLUTIONS=01-11 pytest tests/test_specdec.py`` grades the student's specdec on the key's
    03-11), so only an edited module that is both selected by ``applied`` and graded by a running test file
    is refused: its tests would grade the answer key, not the student's code.
    """
    from g2c.course import SOLUTIONS_ENV

    mine = [i for i in applied if i in worked and i in running]
    if not mine:
        return None
    first = mine[0]
    return (f"g2c: {SOLUTIONS_ENV} selects module(s) {', '.join(mine)} that you edited, so their tests would grade "
            f"the answer key, not your code. Grade with ./test.sh {first} (the answer key only for the modules "
            f"{first} needs that you have not edited), or set {REPLACE_EDITED}=1 to run the answer key anyway.")


def graded_modules(args: list[str], root: Path = REPO_ROOT, cwd: Path | None = None) -> list[str]:
    """The modules whose test files a pytest run over ``args`` selects: a file named directly (``tests/x.py``,
    ``tests/x.py::test_y``) or lying under a named folder (``tests``; a bare ``pytest`` runs ``testpaths``)."""
    from g2c.course import MODULES

    named = [((cwd or Path.cwd()) / a.split("::")[0]).resolve() for a in args]

    def selected(test: str) -> bool:
        path = (root / test).resolve()
        return any(path == n or n in path.parents for n in named)

    return [m.id for m in MODULES if any(selected(t) for t in m.tests)]


def pytest_configure(config) -> None:
    # Refuse before collecting: a selector that names an edited module whose tests run would silently grade
    # the answer key.
    import g2c

    if not g2c.APPLIED_SOLUTIONS or os.environ.get(REPLACE_EDITED, "") == "1":
        return
    from g2c.course.scaffolds import worked_modules

    msg = replaced_own_work_message(list(g2c.APPLIED_SOLUTIONS), worked_modules(),
                                    graded_modules(list(config.args) or ["tests"], cwd=config.invocation_params.dir))
    if msg:
        _drop_import_notice(config)
        pytest.exit(msg, returncode=4)


def _drop_import_notice(config) -> None:
    """Before a refusal: drop ``import g2c``'s notice ("g2c: using reference solutions ...", "this replaces
    your own code ..."). pytest captured it while loading this file and would print it after the refusal,
    where it reads as if the tests ran on the answer key; nothing runs. Any other captured output is kept."""
    import sys

    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        return
    out, err = capman.read_global_capture()
    notice = ("g2c: using reference solutions", "g2c: this replaces your own code")
    sys.stdout.write(out)
    sys.stderr.write("".join(line for line in err.splitlines(keepends=True) if not line.startswith(notice)))


def pytest_report_header(config) -> list[str]:
    return list(_solutions_lines())


def pytest_terminal_summary(terminalreporter) -> None:
    # Repeated at the end (the header scrolls away, and -q hides it).
    lines = _solutions_lines()
    if lines:
        terminalreporter.write_sep("=", "whose code ran")
        for line in lines:
            terminalreporter.write_line(line)


# -- pytest --fake-device: every listed test file on the fake accelerator of tests/device_mocks.py --

# Every module's test files (the registry's ``tests``): the course's code must run on a user's GPU/MPS.
# Files not yet ready for it would be listed here (with the reason); every module's file runs today.
NOT_ON_THE_FAKE_DEVICE_YET: tuple[str, ...] = ()


def _fake_device_files() -> tuple[str, ...]:
    from g2c.course import MODULES

    return tuple(Path(t).name for m in MODULES for t in m.tests if Path(t).name not in NOT_ON_THE_FAKE_DEVICE_YET)


FAKE_DEVICE_FILES = _fake_device_files()


def pytest_addoption(parser) -> None:
    parser.addoption("--fake-device", action="store_true", default=False,
                     help="run every module's tests with every model parameter on the fake "
                          "accelerator of tests/device_mocks.py: device mixing, float64 and ops MPS lacks raise "
                          "inside the course's code (./test.sh --author runs this step)")


def pytest_collection_modifyitems(config, items) -> None:
    """Under ``--fake-device`` only the listed files run, and not their ``ladder`` tests (the
    tiny models cover the device logic; the real ladder would only make the run slow) nor their
    ``own_device`` tests (they check device placement themselves, e.g. that a module lands on the
    CPU, which the fake device's moved parameters would contradict)."""
    if not config.getoption("--fake-device"):
        return
    keep = [i for i in items if i.path.name in FAKE_DEVICE_FILES and i.get_closest_marker("ladder") is None
            and i.get_closest_marker("own_device") is None and i.get_closest_marker("cpu_mock") is None]
    config.hook.pytest_deselected(items=[i for i in items if i not in keep])
    items[:] = keep


@pytest.fixture(autouse=True)
def _fake_device(request):
    """Under ``--fake-device``, run each listed test file's tests inside ``FakeAccelerator``."""
    if not request.config.getoption("--fake-device") or request.path.name not in FAKE_DEVICE_FILES \
            or hasattr(request.module, "FakeAccelerator"):   # files that drive the fake device themselves
        yield
        return
    from device_mocks import FakeAccelerator

    with FakeAccelerator(params_on_device=True, library_only=(str(REPO_ROOT / "g2c"), str(REPO_ROOT / "solutions"))):
        yield
