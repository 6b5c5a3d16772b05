"""``./checkpoints.sh``: verify, install or retrain the shipped artifacts.

The artifacts: the TinyStories sample (a corpus: data, never trained), the StoryTokenizer,
the StoryLM ladder and the drafters trained against it (``g2c/assets/recipes/drafters.py``).

Usage (``python -m g2c.assets.checkpoints`` is the same)::

    ./checkpoints.sh                      verify every artifact, one line each; exit 0 iff all OK
    ./checkpoints.sh --from DIR           install from a mirror laid out like artifacts/
    G2C_ARTIFACTS_URL=https://host/path ./checkpoints.sh
                                          download missing or corrupted artifacts
    ./checkpoints.sh --from DIR --force   also replace verified artifacts
    ./checkpoints.sh --train [NAME...]    retrain with the recipes in g2c/assets/recipes/ladder.py and
                                          g2c/assets/recipes/drafters.py (not the corpus); re-pins them
    ./checkpoints.sh --pin NAME...        pin the installed copy in g2c/assets/pins.json (an author
                                          replacing an artifact on purpose; commit both)

A missing or corrupted artifact is restored from the first source available: ``--from
DIR``, then ``$G2C_ARTIFACTS_URL``, then the copy committed in git (``HEAD``). Every
source copy is checked against its own manifest *and* against the record pinned in the
repository (``g2c/assets/pins.json``: sizes first, then sha256), so a mirror holding another
model under a shipped name is refused. Installs go through ``write_artifact`` (temp folder +
rename), so a killed run never leaves a half-written artifact that passes verification, and
the next run cleans up what it left (and says so). A verified artifact is only replaced with
``--force``. A read-only checkout, a full disk or an unwritable folder is one line naming the
path and the fix, exit 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import g2c
from g2c.assets import artifacts as _artifacts
from g2c.assets.artifacts import (
    ARTIFACTS_DIR,
    CORPUS_FILE,
    CORPUS_NAMES,
    TOKENIZER_NAMES,
    ArtifactError,
    ArtifactMissingError,
    ChecksumError,
    _rel,
    artifact_dir,
    artifact_kind,
    canonical_name,
    clean_artifact_leftovers,
    drafter_names,
    is_verified,
    manifest_files,
    model_names,
    pinned_files,
    pins_from_tree,
    verify_artifact,
    write_artifact,
    write_pins,
)
from g2c.course import module_ids
from g2c.course.files import check_writable, write_problem
from g2c.course.hook import loaded_course_modules

URL_ENV = "G2C_ARTIFACTS_URL"
REQUIRED_FILES = {"model": ("model.safetensors", "config.json"), "tokenizer": ("tokenizer.json",),
                  "corpus": (CORPUS_FILE, "LICENSE.md")}

__all__ = ["all_names", "artifact_state", "install_from_dir", "install_from_git", "install_from_url", "main",
           "resolve_names"]


def _solutions_applied() -> bool:
    return set(module_ids()) <= set(g2c.APPLIED_SOLUTIONS)


def all_names() -> tuple[str, ...]:
    """Every artifact name in dependency order: the corpus the tokenizer was trained on, the
    tokenizer, then the models."""
    return CORPUS_NAMES + trainable_names()


def trainable_names() -> tuple[str, ...]:
    """The artifacts ``--train`` rebuilds: the tokenizer, the ladder, then the drafters that
    learn from it (the corpus is data)."""
    return TOKENIZER_NAMES + model_names() + drafter_names()


def resolve_names(names: list[str] | None) -> list[str]:
    """Canonical names in dependency order (corpus, tokenizer, models); all of them when ``names`` is empty.

    Raises:
        ValueError: an unknown name (the message lists every name).
    """
    if not names:
        return list(all_names())
    wanted = {canonical_name(n) for n in names}
    return [n for n in all_names() if n in wanted]


def _kind(name: str) -> str:
    return artifact_kind(name)


def artifact_state(name: str, root: Path | None = None) -> tuple[str, dict | None, str]:
    """("OK" | "MISSING" | "CORRUPT", manifest or None, the verification message)."""
    try:
        return "OK", verify_artifact(name, root), ""
    except ArtifactMissingError as exc:
        return "MISSING", None, str(exc)
    except ChecksumError as exc:
        return "CORRUPT", None, str(exc)


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def _line(name: str, root: Path | None, state: str, manifest: dict | None, note: str = "") -> str:
    folder = artifact_dir(name, root)
    size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) if folder.is_dir() else 0
    try:
        extra = _summary(name, manifest)
    except (TypeError, ValueError, AttributeError):  # a verified manifest with odd metadata: no summary
        extra = ""
    text = f"{name:<20} {state:<8} {_human(size) if size else '-':>9}  {extra}".rstrip()
    return f"{text}  ({note})" if note else text


def _summary(name: str, manifest: dict | None) -> str:
    extra = ""
    if manifest is not None:
        if _kind(name) == "model" and "val_loss" in manifest:
            extra = f"val_loss {manifest['val_loss']:.4f}"
        elif _kind(name) == "model" and "drafter" in manifest:
            val = manifest.get("val", {})
            agree = val.get("val_agree", val.get("val_agree_1"))      # lineage drafters: the first position
            own = manifest.get("recipe", {}).get("text") in ("greedy", "mixed")     # not the corpus's windows
            extra = f"{manifest['drafter']} drafter for {manifest.get('base', '?')}" + (
                f", val top-1 agreement {agree:.3f}" + (" (on the base's own text)" if own else "")
                if isinstance(agree, float) else "")
        elif _kind(name) == "tokenizer":
            extra = f"vocab {manifest.get('recipe', {}).get('vocab_size', '?')}"
        elif _kind(name) == "corpus":
            extra = f"{manifest.get('stories', '?'):,} stories, {manifest.get('license', '?')}"
    return extra


def _check_complete(name: str, manifest: dict, where: str) -> None:
    missing = [f for f in REQUIRED_FILES[_kind(name)] if f not in manifest.get("files", {})]
    if missing:
        raise ChecksumError(f"{where}: the manifest of {name} does not list {', '.join(missing)}")


def install_from_dir(name: str, source_root: Path, *, root: Path | None = None, force: bool = False) -> Path:
    """Install ``name`` from a mirror laid out like ``artifacts/`` (``models/<Name>/...``).

    The source copy is verified against its own manifest and against the pinned record
    (``g2c/assets/pins.json``, sizes before hashes) first; the install is atomic and the
    installed copy is verified against the pins again.

    Raises:
        ArtifactMissingError / ChecksumError: the source copy is missing, incomplete or corrupted,
            or is not the pinned artifact (a mirror whose ``StoryLM-1M`` holds another model).
        FileExistsError: a verified artifact is already installed and ``force`` is False.
        OSError: the destination cannot be written (read-only, full disk).
    """
    name = canonical_name(name)
    source_root = Path(source_root)
    src_manifest = artifact_dir(name, source_root) / "manifest.json"
    try:
        listed = manifest_files(json.loads(src_manifest.read_text()), src_manifest)
    except (OSError, ValueError):
        listed = None  # verify_artifact below says what is wrong
    try:
        if listed is not None:
            _check_complete(name, {"files": listed}, str(artifact_dir(name, source_root)))
        manifest = verify_artifact(name, source_root, pinned=True)  # sizes against the pins before any hash
    except ArtifactError as exc:              # the advice to run ./checkpoints.sh is about artifacts/, not the mirror
        why = str(exc)                        # (the pins' advice names git or a trusted mirror: it stays)
        if "a trusted mirror)" not in why:
            why = re.sub(r"[:;.]? ?\(?(run|or) \./checkpoints\.sh.*$", "", why, flags=re.I).rstrip(" :;(")
        raise type(exc)(f"source copy under {source_root} is unusable: {why} (fix or replace the mirror's "
                        "copy)") from exc
    src = artifact_dir(name, source_root)
    meta = {k: v for k, v in manifest.items() if k != "files"}
    dest = write_artifact(name, {f: src / f for f in manifest["files"]}, meta, root=root, force=force)
    installed = verify_artifact(name, root, pinned=True)
    if installed["files"] != manifest["files"]:  # the source changed while we copied it
        raise ChecksumError(f"{name}: the installed files differ from the source manifest; run it again")
    return dest


def _download(url: str, path: Path, *, timeout: float, max_bytes: int | None = None) -> str:
    """Stream ``url`` to ``path``; return its sha256. Stops as soon as more than ``max_bytes``
    arrive (the pinned size: a huge file is refused without reading it all)."""
    h = hashlib.sha256()
    n = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(path, "wb") as f:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                n += len(chunk)
                if max_bytes is not None and n > max_bytes:
                    raise ChecksumError(f"{url} is larger than the pinned {max_bytes:,} bytes: not the shipped file; "
                                        "use another mirror or restore from git with ./checkpoints.sh")
                h.update(chunk)
                f.write(chunk)
    except ChecksumError:
        raise
    except (urllib.error.URLError, ValueError) as exc:
        raise ArtifactMissingError(f"could not download {url}: {exc}") from exc
    except OSError as exc:
        if getattr(exc, "errno", None) is not None and exc.filename is not None:
            raise  # our side: a full disk or an unwritable temp folder, reported as such
        raise ArtifactMissingError(f"could not download {url}: {exc}") from exc
    return h.hexdigest()


def install_from_url(name: str, base_url: str, *, root: Path | None = None, force: bool = False,
                     timeout: float = 30.0) -> Path:
    """Download ``<base_url>/<models|tokenizers>/<Name>/manifest.json`` and its files, verify, install.

    Raises:
        ArtifactMissingError: a download failed (the message names the URL).
        ChecksumError: a downloaded file does not match the manifest.
        FileExistsError: a verified artifact is already installed and ``force`` is False.
    """
    name = canonical_name(name)
    rel = artifact_dir(name, Path(".")).as_posix()
    base = f"{base_url.rstrip('/')}/{rel}/"
    with tempfile.TemporaryDirectory(prefix="g2c-download-") as tmp:
        folder = artifact_dir(name, Path(tmp))
        folder.mkdir(parents=True)
        _download(base + "manifest.json", folder / "manifest.json", timeout=timeout)
        try:
            parsed = json.loads((folder / "manifest.json").read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ChecksumError(f"{base}manifest.json is not a valid manifest ({exc})") from exc
        files = manifest_files(parsed, f"{base}manifest.json")  # refuses ../x before any download
        pins = pinned_files(name)
        for fname, expected in files.items():
            if fname not in pins or pins[fname]["sha256"] != expected:
                raise ChecksumError(f"{base}manifest.json: {fname} is not the pinned {name}/{fname} ("
                                    f"{_rel(_artifacts.PINS_FILE)} pins "
                                    f"{pins[fname]['sha256'] if fname in pins else 'no such file'}, the mirror says "
                                    f"{expected}); use another mirror or restore from git with ./checkpoints.sh")
            got = _download(base + fname, folder / fname, timeout=timeout, max_bytes=pins[fname]["size"])
            if got != expected:
                raise ChecksumError(f"downloaded {base}{fname} has sha256 {got}, manifest says {expected}")
        return install_from_dir(name, Path(tmp), root=root, force=force)


def install_from_git(name: str, *, root: Path | None = None, force: bool = False) -> Path | None:
    """Restore ``name`` from the copy committed at git ``HEAD``; None when there is none.

    Applies when ``root`` is the ``artifacts/`` folder of a git work tree that tracks the artifact.
    The committed copy is checked against the pins like any other source.

    Raises:
        OSError: the checkout cannot be written (read-only, full disk): git holds a copy, but it
            cannot be put in place; the caller says so (never "no source").
        ArtifactError: the committed copy is not the pinned one.
    """
    name = canonical_name(name)
    root = Path(root) if root is not None else ARTIFACTS_DIR
    if root.resolve().name != "artifacts":
        return None
    repo = root.resolve().parent
    rel = artifact_dir(name, Path("artifacts")).as_posix()

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=True).stdout

    try:
        tracked = git("ls-tree", "--name-only", "HEAD", f"{rel}/").decode().split()
        if not tracked:
            return None
        blobs = {Path(path).name: git("show", f"HEAD:./{path}") for path in tracked}
    except (OSError, subprocess.CalledProcessError):  # no git, not a work tree, nothing committed
        return None
    with tempfile.TemporaryDirectory(prefix="g2c-git-") as tmp:
        folder = artifact_dir(name, Path(tmp))
        folder.mkdir(parents=True)
        for fname, blob in blobs.items():
            (folder / fname).write_bytes(blob)
        return install_from_dir(name, Path(tmp), root=root, force=force)


def _repair(name: str, *, root: Path | None, source: Path | None, url: str | None, force: bool) -> str | None:
    """Install ``name`` from the first source; return a note naming the source, None without one."""
    if source is not None:
        install_from_dir(name, source, root=root, force=force)
        return f"installed from {source}"
    if url:
        install_from_url(name, url, root=root, force=force)
        return f"downloaded from {url}"
    if install_from_git(name, root=root, force=force) is not None:
        return "restored from git HEAD"
    return None


def _mirror_root(path: Path) -> Path:
    """Accept a mirror root (``models/``, ``tokenizers/``) or a checkout holding ``artifacts/``."""
    if not (path / "models").is_dir() and not (path / "tokenizers").is_dir() and (path / "artifacts").is_dir():
        return path / "artifacts"
    return path


def verify_or_install(names: list[str], *, root: Path | None, source: Path | None, force: bool,
                      out=print, err=None) -> int:
    """The default command and ``--from``: report each artifact, installing from a source where needed."""
    if err is None:
        def err(msg: str) -> None:
            sys.stdout.flush()
            print(msg, file=sys.stderr, flush=True)
    url = os.environ.get(URL_ENV) or None
    clean_artifact_leftovers(root, log=lambda line: err(f"checkpoints: {line}"))
    t0 = time.time()
    bad = 0
    if source is not None and not any((artifact_dir(n, source) / "manifest.json").is_file() for n in names):
        err(f"checkpoints: note: {source} holds none of the {len(names)} artifacts asked for (no "
            "models/<Name>/manifest.json nor tokenizers/<Name>/manifest.json): is it a mirror laid out like "
            "artifacts/?")
    for name in names:
        state, manifest, message = artifact_state(name, root)
        note, failure = "", ""
        if state != "OK" or (force and (source is not None or url)):
            before = state
            try:
                note = _repair(name, root=root, source=source, url=url, force=force) or ""
            except ArtifactError as exc:
                failure, note = str(exc), "install failed, see below"
            except OSError as exc:  # read-only checkout, full disk: the source exists, the write failed
                failure, note = write_problem(exc, artifact_dir(name, root)), "install failed, see below"
            state, manifest, message = artifact_state(name, root)
            if before != "OK" and note:
                note = f"was {before}: {note}"
            elif failure and state == "OK":
                note = "the installed copy is kept: the new copy could not replace it, see below"
        elif source is not None:
            note = "already installed and verified; --force replaces it"
        out(_line(name, root, state, manifest, note))
        if state != "OK" or failure:  # a failed --force replace leaves the old copy OK: still a failure
            bad += 1
            err(f"  {failure or message}")
            if not note:
                rebuild = f", or rebuild it with ./checkpoints.sh --train {name}" if name in trainable_names() else ""
                err(f"  no source to restore it from: pass --from DIR or set ${URL_ENV}{rebuild}")
    summary = f"{len(names) - bad}/{len(names)} artifacts OK in {time.time() - t0:.1f}s"
    (out if not bad else err)(summary if not bad else f"{summary}; see above")
    return 0 if not bad else 1


def train(names: list[str], *, force: bool, root: Path | None, out=print, budget: int | None = None,
          variant: str | None = None) -> int:
    """``--train``: skip verified artifacts (unless force), then train the rest with solutions applied.
    ``budget`` (target tokens, ``--budget``): drafters only, installed under ``runs/budget-<T>/``;
    ``variant`` (``--variant``, with a budget): a recipe variant, under ``runs/budget-<T>-<variant>/``."""
    if variant is not None and budget is None:
        print("checkpoints: error: --variant goes with --train NAME --budget TOKENS (a variant is measured "
              "beside the plain drafter at the same budget)", file=sys.stderr)
        return 2
    if budget is not None:                          # a budgeted retrain (issue 29): never over the shipped artifact
        from g2c.assets.recipes import drafters

        bad = [n for n in names if n not in drafters.DRAFTER_RECIPES]
        if bad or not names:
            print(f"checkpoints: error: --budget retrains drafters only ({', '.join(drafters.DRAFTER_RECIPES)}); "
                  f"name one, e.g. --train StoryLM-30M-EAGLE3 --budget 200k"
                  + (f" (not {', '.join(bad)})" if bad else ""), file=sys.stderr)
            return 2
        if not _solutions_applied():
            print("checkpoints: error: training runs the course's code with every reference solution applied; "
                  "run ./checkpoints.sh --train (it selects them) or set G2C_APPLY_SOLUTIONS=all", file=sys.stderr)
            return 1
        if variant is not None:
            try:
                for name in names:
                    drafters.budgeted_recipe(name, budget, variant)
            except ValueError as exc:
                print(f"checkpoints: error: {exc}", file=sys.stderr)
                return 2
        for name in names:
            try:
                dest = drafters.train_drafter(name, force=force, budget=budget, variant=variant)
            except FileExistsError as exc:
                out(f"{name:<18} OK       {exc}")
                continue
            except (FileNotFoundError, ValueError) as exc:
                print(f"checkpoints: error: cannot train {name}: {exc}", file=sys.stderr)
                return 1
            except KeyboardInterrupt:
                print(f"checkpoints: {name} interrupted; run the same command again to resume", file=sys.stderr)
                return 130
            seen = drafters.budgeted_recipe(name, budget, variant)["budget_tokens"]          # whole steps
            out(f"{name:<18} trained  at a budget of {seen:,} target tokens -> {dest}")
        return 0
    todo = []
    for name in names:
        if not force and is_verified(name, root):
            out(f"{name:<18} OK       already trained and verified; skipping (--force retrains it)")
        else:
            todo.append(name)
    if not todo:
        return 0
    if root is not None and Path(root).resolve() != ARTIFACTS_DIR.resolve():
        out("checkpoints: --train always writes to artifacts/; drop --root")
        return 2
    if not _solutions_applied():
        print("checkpoints: error: training runs the course's code with every reference solution applied; "
              "run ./checkpoints.sh --train (it selects them) or set G2C_APPLY_SOLUTIONS=all", file=sys.stderr)
        return 1
    from g2c.course import REPO_ROOT

    try:  # before minutes of training whose result could not be saved
        for folder, what in ((artifact_dir(todo[0]).parent.parent, "artifacts"),
                             (_artifacts.PINS_FILE.parent, "pinned record"), (REPO_ROOT / "runs", "training runs")):
            check_writable(folder, what)
    except OSError as exc:
        print(f"checkpoints: error: {write_problem(exc)}; nothing was trained", file=sys.stderr)
        return 1
    clean_artifact_leftovers(log=lambda line: out(f"checkpoints: {line}"))
    from g2c.assets.recipes import drafters, ladder

    if "StoryTokenizer" in todo and any(is_verified(m) for m in model_names() if m not in todo):
        out("checkpoints: warning: a new StoryTokenizer does not match the models trained with the old one; "
            "retrain them too (./checkpoints.sh --train --force)")
    for name in todo:
        try:
            if name == "StoryTokenizer":
                ladder.train_tokenizer(force=True)
            elif name in drafter_names():
                drafters.train_drafter(name, force=force)
            else:
                ladder.train_model(name, force=force)
            changed = write_pins(pins_from_tree(None, (name,)))
        except (FileNotFoundError, ValueError) as exc:  # e.g. data not prepared, tokenizer missing
            print(f"checkpoints: error: cannot train {name}: {exc}", file=sys.stderr)
            return 1
        except OSError as exc:  # a full disk or a folder turned read-only mid-run
            print(f"checkpoints: error: cannot save {name}: {write_problem(exc)}", file=sys.stderr)
            return 1
        out(_line(name, None, *artifact_state(name)[:2], "trained"))
        out(f"  pinned the new {name} in {_rel(_artifacts.PINS_FILE)}: commit it with {_rel(artifact_dir(name))}/"
            if changed else f"  {name} is byte-identical to its pin in {_rel(_artifacts.PINS_FILE)}")
    return 0


def pin(names: list[str], *, out=print) -> int:
    """``--pin NAME...``: record the installed copy of each artifact (verified against its own
    manifest) as the pinned one in ``g2c/assets/pins.json``. For authors replacing an artifact
    on purpose; everyone else restores the pinned copy with ``./checkpoints.sh``."""
    try:
        update = pins_from_tree(None, tuple(names))
        changed = write_pins(update)
    except ArtifactError as exc:
        print(f"checkpoints: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"checkpoints: error: {write_problem(exc, _artifacts.PINS_FILE)}", file=sys.stderr)
        return 1
    for name in names:
        out(f"{name:<20} {'pinned (changed)' if name in changed else 'pinned (unchanged)'}")
    if changed:
        out(f"commit {_rel(_artifacts.PINS_FILE)} together with the artifacts it pins")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="./checkpoints.sh",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Verify, install or retrain the shipped artifacts: "
                    f"{', '.join(all_names())} (names are case-insensitive).",
        epilog=f"""without options: verify every artifact (sha256 against its manifest), one line each;
  exit 0 only if all are OK. A missing or corrupted artifact is restored from --from DIR,
  else ${URL_ENV}, else the copy committed in git.

examples:
  ./checkpoints.sh                         verify everything
  ./checkpoints.sh --from /mnt/mirror      install from a folder laid out like artifacts/
  ./checkpoints.sh --from /mnt/mirror --force
                                           ... replacing verified artifacts too
  {URL_ENV}=https://host/g2c ./checkpoints.sh
                                           download <URL>/models/<Name>/manifest.json and its files
  ./checkpoints.sh --train StoryLM-1M      retrain one model (resumes runs/<Name>/ if present)
  ./checkpoints.sh --train StoryLM-30M-EAGLE
                                           retrain one drafter (resumes runs/<Name>/drafter.pt)
  ./checkpoints.sh --train StoryLM-30M-EAGLE3 --budget 200k
                                           retrain a drafter at a budget of target tokens seen (or
                                           'equal': EAGLE's 5.7M) into runs/budget-<T>/; resumable
  ./checkpoints.sh --train StoryLM-30M-Block --budget 512k --variant kv
                                           a paper design or an ablation at that budget (Block: kv, self,
                                           mixed, corpus; EAGLE3: ttt1, ttt7, self; EAGLE: tokens, self; Medusa:
                                           self) into runs/budget-<T>-<variant>/
  ./checkpoints.sh --train --force         retrain everything from scratch: tokenizer, ladder, drafters
                                           (the TinyStories sample is data: verified and restored, never trained)""")
    ap.add_argument("names", nargs="*", metavar="NAME", help="artifacts to act on (default: all)")
    ap.add_argument("--train", nargs="*", metavar="NAME",
                    help="retrain these (default: all, tokenizer first) with the recipes in "
                         "g2c/assets/recipes/ (ladder.py, drafters.py); "
                         "needs ./datasets.sh first; applies G2C_APPLY_SOLUTIONS=all")
    ap.add_argument("--pin", action="store_true",
                    help="record the installed NAMEs (each verified against its own manifest) as the pinned copies "
                         "in g2c/assets/pins.json: for an author replacing an artifact on purpose")
    ap.add_argument("--budget", metavar="TOKENS", default=None,
                    help="with --train NAME: a drafter's training budget in target tokens seen (5734400, 5.7M, "
                         "200k, or 'equal' = EAGLE's); steps follow from it; installs into runs/budget-<T>/")
    ap.add_argument("--variant", metavar="NAME", default=None,
                    help="with --train NAME --budget T: a recipe variant (g2c.assets.recipes.drafters."
                         "RECIPE_VARIANTS: Block kv/self/mixed/corpus, EAGLE3 ttt1/ttt7/self, EAGLE tokens/self, "
                         "Medusa self); installs into "
                         "runs/budget-<T>-<variant>/")
    ap.add_argument("--from", dest="source", metavar="DIR", help="install from a mirror laid out like artifacts/")
    ap.add_argument("--force", action="store_true", help="replace verified artifacts (install or retrain)")
    ap.add_argument("--root", type=Path, default=None, help=argparse.SUPPRESS)  # tests: another artifacts/
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--train" in argv and not _solutions_applied() and not loaded_course_modules():
        # The recipes run the course's own code with the reference solutions applied. Select
        # them before anything imports a course module (the parser's help lists the ladder's
        # names, which come from module 09).
        os.environ.setdefault("G2C_QUIET", "1")
        g2c.use_solutions("all")
    args = build_parser().parse_args(argv)
    corpora = {c.lower(): c for c in CORPUS_NAMES}
    data_only = [corpora[n.strip().lower()] for n in (args.train or []) + args.names if n.strip().lower() in corpora]
    if args.train is not None and data_only:
        print(f"checkpoints: error: {', '.join(data_only)} is data, not trained: ./checkpoints.sh restores "
              "it from --from, $G2C_ARTIFACTS_URL or git", file=sys.stderr)
        return 2
    try:
        names = resolve_names((args.train or []) + args.names)
    except ValueError as exc:
        print(f"checkpoints: error: {exc}", file=sys.stderr)
        return 2
    if args.pin:
        if (args.train is not None or args.source or not args.names or args.budget is not None
                or args.variant is not None or args.force):
            print("checkpoints: error: --pin takes the NAMEs to pin and no other option", file=sys.stderr)
            return 2
        return pin(names)
    if args.train is not None:
        names = [n for n in names if n in trainable_names()]
        if args.source:
            print("checkpoints: error: --train and --from do not mix", file=sys.stderr)
            return 2
        budget = None
        if args.budget is not None:
            from g2c.assets.recipes.drafters import parse_budget

            try:
                budget = parse_budget(args.budget)
            except ValueError as exc:
                print(f"checkpoints: error: {exc}", file=sys.stderr)
                return 2
        return train(names, force=args.force, root=args.root, budget=budget, variant=args.variant)
    if args.budget is not None or args.variant is not None:
        print("checkpoints: error: " + ("--budget goes with --train NAME" if args.variant is None
                                        else "--variant goes with --train NAME --budget TOKENS"), file=sys.stderr)
        return 2
    source = None
    if args.source is not None and not args.source.strip():     # '' read as "no --from" installed from git
        print("checkpoints: error: --from '': an empty path; give the mirror's folder", file=sys.stderr)
        return 2
    if args.source:
        source = _mirror_root(Path(args.source))
        if source.exists() and not source.is_dir():
            print(f"checkpoints: error: --from {args.source} is a file; give the mirror's folder (the one "
                  "holding models/ and tokenizers/, or a checkout holding artifacts/)", file=sys.stderr)
            return 2
        if not source.is_dir():
            print(f"checkpoints: error: --from {args.source}: no such folder", file=sys.stderr)
            return 2
    return verify_or_install(names, root=args.root, source=source, force=args.force)


def _entry() -> int:
    try:
        return main()
    except KeyboardInterrupt:
        print("\ncheckpoints: interrupted; every artifact is either the previous copy or the complete new one "
              "(nothing half-written); run it again to finish", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(_entry())
