#!/usr/bin/env python3
"""Run a notebook in a real browser (JupyterLab + headless Chromium) and save screenshots.

What a student sees in Jupyter Lab is not what ``scripts/run_notebooks.py`` checks: widgets,
progress bars, figures stacked under each other, rendered maths. This script repeats that check
by hand (it is not part of CI):

1. builds the solved twin of a module's notebook (or takes an ``.ipynb`` as it is) into
   ``notebooks/work/<stem>.screenshot.ipynb`` (git-ignored);
2. starts JupyterLab on 127.0.0.1 only, with a random token, a throw-away settings folder
   (every cell rendered, no windowing) and the environment of ``run_notebooks.py``
   (``G2C_APPLY_SOLUTIONS=all`` unless ``--apply SEL``, ``G2C_QUICK=1`` unless ``--full``, ``G2C_QUIET=1``) plus
   ``G2C_WIDGETS=1`` (a frontend is there: notebooks show their widgets even in quick mode);
3. opens the notebook in headless Chromium (playwright), runs Run > Run All Cells, waits until
   no cell is queued or running, optionally clicks every button with a given label
   (``--click Simulate``) and waits again;
4. saves full-width screenshots scrolling down the notebook, ``OUT/<stem>-NN.png``, and prints
   the text of every error output it sees (exit code 1 if there is one).

    python scripts/notebooks/screenshot.py 16                       # -> notebooks/work/screenshots/
    python scripts/notebooks/screenshot.py specdec-lab --click Simulate --out /tmp/shots
    python scripts/notebooks/screenshot.py path/to/any.ipynb --full # run it as it is, without G2C_QUICK

Needs the ``browser`` extra (``pip install -e '.[browser]'``: playwright) and a Chromium:
``--chromium PATH`` or the first of chromium / chromium-browser / google-chrome on PATH
(``apt-get install chromium``), else playwright's own (``playwright install chromium``).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location("g2c_notebook_build", ROOT / "scripts" / "notebooks" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

WORK = ROOT / "notebooks" / "work"
SETTINGS = {  # a throw-away user settings folder: every cell rendered (no windowing), no news pop-up
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": '{"windowingMode": "none"}',
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": '{"fetchNews": "false"}',
}
STARTED_JS = r"""() => [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
                         .some(p => /\[[0-9*]+\]/.test(p.textContent))"""
STDERR_SELECTOR = ".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']"  # tracebacks too


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_chromium(explicit: str | None) -> str | None:
    """The Chromium executable to use, or None for playwright's bundled browser.

    Raises:
        FileNotFoundError: ``explicit`` was given and does not exist.
    """
    if explicit:
        if not Path(explicit).exists():
            raise FileNotFoundError(f"--chromium {explicit}: no such file; give the path of a Chromium executable")
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def prepare(item: str) -> Path:
    """The notebook to run: a module's solved twin, or a given ``.ipynb`` copied into notebooks/work/.

    Raises:
        ValueError: unknown module id (the message lists the ids).
    """
    path = Path(item)
    WORK.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".ipynb" and path.exists():
        out = WORK / f"{path.stem}.screenshot.ipynb"
        shutil.copyfile(path, out)
        return out
    from g2c.course import get_module

    module = get_module(item)
    return build.write_solved(module, WORK, name=f"{build.stem_of(module)}.screenshot.ipynb")


def start_lab(port: int, token: str, settings: Path, env: dict[str, str], log) -> subprocess.Popen:
    """Start JupyterLab on 127.0.0.1:port (no browser, this token); return the process once it answers.

    Raises:
        RuntimeError: it exited or did not answer within 120 s (see the log file).
    """
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [str(jupyter) if jupyter.exists() else "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
           f"--LabApp.user_settings_dir={settings / 'user'}", f"--LabApp.workspaces_dir={settings / 'workspaces'}",
           "--ServerApp.open_browser=False"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")   # containers and CI boxes often run as root
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with code {proc.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2):
                return proc
        except OSError:
            time.sleep(1)
    proc.terminate()
    raise RuntimeError(f"jupyter lab did not answer on 127.0.0.1:{port} within 120 s; see {log.name}")


def accept_kernel_dialog(page) -> None:
    """Accept the "Select Kernel" dialog (the default kernel) if JupyterLab shows one."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=5000)
    except PlaywrightTimeout:
        return
    page.locator(".jp-Dialog .jp-mod-accept").click()


def wait_until_idle(page, timeout_s: float) -> None:
    """Wait until no code cell is queued or running ("[*]") and the kernel is idle.

    Raises:
        TimeoutError: still busy after timeout_s.
    """
    deadline = time.time() + timeout_s
    quiet_since = None
    while time.time() < deadline:
        busy = page.evaluate("""() => [...document.querySelectorAll('.jp-InputPrompt')]
                                       .some(p => p.textContent.includes('*'))""")
        if not busy:
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since > 3:   # stays quiet: not between two cells
                return
        else:
            quiet_since = None
        time.sleep(1)
    raise TimeoutError(f"cells still running after {timeout_s:.0f} s")


def screenshots(page, out: Path, stem: str) -> list[Path]:
    """Scroll the notebook panel top to bottom, one screenshot per screen; return the files."""
    scroller = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer"
    page.evaluate(f"() => document.querySelector('{scroller}').scrollTo(0, 0)")
    files, last = [], -1
    for i in range(200):
        page.wait_for_timeout(700)   # let figures and widgets settle
        path = out / f"{stem}-{i:02d}.png"
        page.screenshot(path=str(path))
        files.append(path)
        top = page.evaluate(f"""() => {{ const el = document.querySelector('{scroller}');
                                         el.scrollBy(0, el.clientHeight * 0.9); return el.scrollTop; }}""")
        if top == last:
            files.pop().unlink()     # the page did not move: the last shot repeats the one before
            break
        last = top
    return files


def run(args) -> int:
    from playwright.sync_api import sync_playwright

    notebook = prepare(args.notebook)
    rel = notebook.relative_to(ROOT).as_posix()
    stem = notebook.name.removesuffix(".screenshot.ipynb")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{stem}-*.png"):
        old.unlink()
    token, port = secrets.token_hex(16), free_port()
    env = dict(os.environ, G2C_APPLY_SOLUTIONS=args.apply, G2C_QUIET="1", G2C_WIDGETS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env["G2C_QUICK"] = "0" if args.full else "1"
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="g2c-lab-") as tmp:
        settings = Path(tmp)
        for name, text in SETTINGS.items():
            (settings / "user" / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / "user" / name).write_text(text)
        log_path = out / f"{stem}-jupyterlab.log"
        with open(log_path, "w") as log:
            lab = start_lab(port, token, settings, env, log)
            try:
                with sync_playwright() as pw:
                    browser = pw.chromium.launch(executable_path=find_chromium(args.chromium),
                                                 args=["--no-sandbox", "--disable-gpu"])
                    page = browser.new_page(viewport={"width": args.width, "height": args.height})
                    page.goto(f"http://127.0.0.1:{port}/doc/tree/{rel}?token={token}")   # the simple one-document view
                    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
                    accept_kernel_dialog(page)
                    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
                    page.get_by_role("menuitem", name="Run", exact=True).click()
                    page.locator("li[data-command='runmenu:run-all']").click()
                    t0 = time.time()
                    page.wait_for_function(STARTED_JS, timeout=120_000)   # a cell is queued, running or done
                    wait_until_idle(page, args.timeout)
                    print(f"{rel}: ran every cell in {time.time() - t0:.0f} s")
                    for label in args.click or []:
                        buttons = page.get_by_role("button", name=label)
                        for i in range(buttons.count()):
                            buttons.nth(i).scroll_into_view_if_needed()
                            buttons.nth(i).click()
                            page.wait_for_timeout(1000)
                            wait_until_idle(page, args.timeout)
                        print(f"clicked {buttons.count()} button(s) labelled {label!r}")
                    errors = [e for e in page.locator(STDERR_SELECTOR).all_inner_texts()
                              if "Traceback (most recent call last)" in e]
                    files = screenshots(page, out, stem)
                    browser.close()
            finally:
                lab.terminate()
                try:
                    lab.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    lab.kill()
    print(f"{len(files)} screenshots: {out}/{stem}-00.png ...; JupyterLab log {log_path}")
    for e in errors:
        print("error output:\n" + e, file=sys.stderr)
    return 1 if errors else 0


def main(argv: list[str] | None = None) -> int:
    from g2c.assets.cli import count, output_dir, real

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebook", help="a module id (its solved twin runs) or an .ipynb path (run as it is)")
    ap.add_argument("--out", type=output_dir(), default=str(WORK / "screenshots"),
                    help="folder for the PNGs (default: %(default)s)")
    ap.add_argument("--click", action="append", metavar="LABEL",
                    help="after the run, click every button with this label (repeatable), e.g. Simulate")
    ap.add_argument("--apply", default="all", metavar="SEL",
                    help="G2C_APPLY_SOLUTIONS for the kernel (default: %(default)s); leave a module out to see "
                         "what a student with that module unwritten sees")
    ap.add_argument("--full", action="store_true", help="run without G2C_QUICK=1 (full-size loops: minutes)")
    ap.add_argument("--timeout", type=real(0, lo_open=True), default=1200,
                    help="seconds to wait for the cells (default: %(default)s)")
    ap.add_argument("--chromium", help="path of a Chromium executable (default: found on PATH)")
    ap.add_argument("--width", type=count(1), default=1280)
    ap.add_argument("--height", type=count(1), default=1000)
    args = ap.parse_args(argv)
    try:
        from playwright.sync_api import Error as PlaywrightError
    except ImportError:
        print("screenshot.py: error: needs playwright: pip install -e '.[browser]' (or pip install playwright)",
              file=sys.stderr)
        return 2
    try:
        return run(args)
    except (ValueError, FileNotFoundError, RuntimeError, TimeoutError, PlaywrightError) as e:
        print(f"screenshot.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
