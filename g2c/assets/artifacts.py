"""The shipped artifacts: the TinyStories sample, the StoryTokenizer and the StoryLM ladder,
verified by sha256.

Layout (CONVENTIONS §4-5)::

    artifacts/corpora/TinyStories-sample/{tinystories-collected.txt.xz, LICENSE.md, manifest.json}
    artifacts/tokenizers/StoryTokenizer/{tokenizer.json, manifest.json}
    artifacts/models/StoryLM-{1M,5M,30M}/{model.safetensors, config.json, manifest.json}

Every ``manifest.json`` lists the sha256 of each other file in its folder. A manifest travels
with its files, so it only proves that they arrived intact, not that they are the right ones:
the expected sha256 and size of every shipped file are also *pinned* in the repository, in
``g2c/assets/pins.json`` beside this loader (as pip's hash-checking mode pins a requirement).
Loading from ``artifacts/`` and every install (git, mirror, download) is checked against the
pins; ``./checkpoints.sh --train NAME`` re-pins what it retrains, ``--pin NAME`` re-pins an
artifact replaced on purpose, and a tooling test fails when the record is stale. Sizes are
compared before anything is hashed. Weights are float16 safetensors (never unpickled) and are
loaded into float32 models.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from g2c.course import REPO_ROOT
from g2c.course.files import atomic_write, clean_leftovers, fsync_dir

ARTIFACTS_DIR = REPO_ROOT / "artifacts"
PINS_FILE = Path(__file__).with_name("pins.json")  # the pinned sha256 and size of every shipped file
TOKENIZER_NAMES = ("StoryTokenizer",)
CORPUS_NAMES = ("TinyStories-sample",)
CORPUS_FILE = "tinystories-collected.txt.xz"  # the corpus inside artifacts/corpora/TinyStories-sample/
# The shipped drafters (recipes in g2c/assets/recipes/drafters.py), each tied to the ladder model it
# serves: "lm" is a standalone TransformerLM (same tokenizer), "mtp" an MTPHead and "eagle" a
# FeatureDrafter on the frozen base, loaded together with it.
DRAFTERS: dict[str, dict] = {
    "StoryLM-1M-distilled": {"kind": "lm", "base": "StoryLM-30M"},
    "StoryLM-5M-MTP": {"kind": "mtp", "base": "StoryLM-5M"},
    "StoryLM-30M-MTP": {"kind": "mtp", "base": "StoryLM-30M"},
    "StoryLM-30M-EAGLE": {"kind": "eagle", "base": "StoryLM-30M"},
    "StoryLM-30M-Medusa": {"kind": "medusa", "base": "StoryLM-30M"},
    "StoryLM-30M-EAGLE3": {"kind": "eagle3", "base": "StoryLM-30M"},
    "StoryLM-30M-Block": {"kind": "block", "base": "StoryLM-30M"},
}

__all__ = ["ARTIFACTS_DIR", "ArtifactError", "ArtifactMissingError", "CORPUS_FILE", "CORPUS_NAMES", "ChecksumError",
           "DRAFTERS", "LOAD_DTYPES", "NOT_A_DEVICE", "TOKENIZER_NAMES", "artifact_dir", "artifact_kind",
           "canonical_name", "check_member_name", "device_problem", "clean_artifact_leftovers", "corpus_path",
           "drafter_names", "is_verified", "load_model", "load_story_tokenizer",
           "load_tokenizer", "manifest_files", "model_names", "pinned_files", "pins_from_tree", "shipped_problem",
           "verify_artifact", "write_artifact", "write_pins"]


class ArtifactError(Exception):
    """Base class of artifact problems."""


class ArtifactMissingError(ArtifactError, FileNotFoundError):
    """An artifact (or one of its files) is not on disk. Fix: ``./checkpoints.sh``."""


class ChecksumError(ArtifactError, ValueError):
    """A file's sha256 differs from its manifest. Fix: ``./checkpoints.sh --force``."""


def model_names() -> tuple[str, ...]:
    """The StoryLM ladder's names, smallest first, read from its one definition
    ``g2c.transformer.LADDER`` (module 09's presets).

    Imported lazily: call ``g2c.use_solutions`` (if you need it) before this.
    """
    from g2c.transformer.config import LADDER

    return tuple(LADDER)


def drafter_names() -> tuple[str, ...]:
    """The shipped drafters (``DRAFTERS``): a distilled StoryLM-1M, MTP heads for StoryLM-5M
    and -30M, and an EAGLE feature drafter for StoryLM-30M."""
    return tuple(DRAFTERS)


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks (manifests record these)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def canonical_name(name: str) -> str:
    """Case-insensitive artifact name -> its canonical spelling.

    Raises:
        ValueError: unknown name; the message names the closest ones (``did you mean``) and lists every
            artifact name.
    """
    from g2c.course.registry import did_you_mean

    names = model_names() + drafter_names() + TOKENIZER_NAMES + CORPUS_NAMES
    for known in names:
        if known.lower() == str(name).strip().lower():
            return known
    raise ValueError(f"unknown artifact {name!r}{did_you_mean(str(name), names)}; known: {', '.join(names)}")


def artifact_kind(name: str) -> str:
    """``"model"``, ``"tokenizer"`` or ``"corpus"``.

    Raises:
        ValueError: unknown name.
    """
    name = canonical_name(name)
    if name in model_names() or name in DRAFTERS:
        return "model"
    return "tokenizer" if name in TOKENIZER_NAMES else "corpus"


def artifact_dir(name: str, root: Path | None = None) -> Path:
    """Folder of an artifact under ``root`` (default ``artifacts/``)."""
    name = canonical_name(name)
    root = Path(root) if root is not None else ARTIFACTS_DIR
    return root / {"model": "models", "tokenizer": "tokenizers", "corpus": "corpora"}[artifact_kind(name)] / name


def corpus_path(name: str = "TinyStories-sample", *, root: Path | None = None) -> Path:
    """Verify the shipped TinyStories sample and return the path of its ``.txt.xz`` file.

    Raises:
        ArtifactMissingError: not on disk; run ``./checkpoints.sh`` (it restores it from git).
        ChecksumError: corrupted; run ``./checkpoints.sh`` (a corrupted copy is restored too).
    """
    verify_artifact(name, root)
    return artifact_dir(name, root) / CORPUS_FILE


def _is_shipped_root(root: Path | None) -> bool:
    if root is None:
        return True
    try:
        return Path(root).resolve() == ARTIFACTS_DIR.resolve()
    except OSError:
        return False


def shipped_problem(path: str | os.PathLike) -> str | None:
    """Why an output must not go to ``path``, or None: it lies inside the shipped ``artifacts/``
    tree, whose files the pins of ``g2c/assets/pins.json`` check on every load. Overwriting one (an
    export "into" its model's folder, a figure saved there) would leave an artifact that fails its
    pins, reported later as a corrupted download. Only ``./checkpoints.sh`` writes there."""
    try:
        target = Path(path).expanduser().resolve()
        rel = target.relative_to(ARTIFACTS_DIR.resolve())
    except (ValueError, OSError):
        return None
    where = _rel(ARTIFACTS_DIR / rel.parts[0] / rel.parts[1]) if len(rel.parts) >= 2 else _rel(ARTIFACTS_DIR)
    return (f"{path} is inside the shipped artifacts ({where}), which ./checkpoints.sh installs and the pins in "
            f"{_rel(PINS_FILE)} check on every load: writing there would damage them; write somewhere else "
            "(e.g. exported/ or runs/)")


def load_pins() -> dict[str, dict[str, dict]]:
    """The pinned record ``g2c/assets/pins.json``: ``{name: {file: {"sha256": hex, "size": bytes}}}``.

    Raises:
        ChecksumError: the record is missing or damaged (the message says to restore it from git).
    """
    try:
        pins = json.loads(PINS_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ChecksumError(f"the pinned artifact record {PINS_FILE} is unreadable ({exc}): restore it with "
                            f"`git checkout -- {_rel(PINS_FILE)}`") from exc
    if not isinstance(pins, dict) or not isinstance(pins.get("artifacts"), dict):
        raise ChecksumError(f"the pinned artifact record {PINS_FILE} has the wrong structure: restore it with "
                            f"`git checkout -- {_rel(PINS_FILE)}`")
    return pins["artifacts"]


def pinned_files(name: str) -> dict[str, dict]:
    """The pinned files of one artifact: ``{file: {"sha256": hex, "size": bytes}}``.

    Raises:
        ChecksumError: the record has no (valid) entry for ``name``.
    """
    name = canonical_name(name)
    entry = load_pins().get(name)
    ok = isinstance(entry, dict) and entry and all(
        isinstance(v, dict) and isinstance(v.get("sha256"), str) and isinstance(v.get("size"), int)
        for v in entry.values())
    if not ok:
        raise ChecksumError(f"{name} has no valid pin in {_rel(PINS_FILE)}: restore the record with `git checkout -- "
                            f"{_rel(PINS_FILE)}`, or pin a verified copy on purpose with "
                            f"./checkpoints.sh --pin {name}")
    return entry


def _rel(path: Path) -> str:
    path = Path(path)
    try:
        return path.resolve().relative_to(REPO_ROOT.resolve()).as_posix()
    except (ValueError, OSError):
        return str(path)


def pin_edited(name: str) -> bool | None:
    """Whether ``name``'s entry in ``g2c/assets/pins.json`` differs from the committed one (``git show
    HEAD:g2c/assets/pins.json``): True or False; None where git cannot say (no git, not a repository:
    a tarball or a copy)."""
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"HEAD:{_rel(PINS_FILE)}"], capture_output=True,
                              text=True, timeout=10)
        committed = json.loads(done.stdout)["artifacts"].get(name) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if done.returncode != 0:
        return None
    try:
        return load_pins().get(name) != committed
    except ChecksumError:
        return True


def _pin_fix(name: str, fix: str) -> str:
    """``fix`` for a folder that fails its pins, or, when the pin itself was edited, the fix for that
    (``--force`` reinstalls the files, which would fail the same edited pin)."""
    rel = _rel(PINS_FILE)
    edited = pin_edited(name)
    if edited:
        return (f"the pin of {name} in {rel} differs from the committed one (an edited pin): restore it with "
                f"`git checkout -- {rel}` (./checkpoints.sh --force reinstalls the files, which fail an edited pin "
                f"the same way), or pin a verified copy on purpose with ./checkpoints.sh --pin {name}")
    if edited is None:
        return f"{fix}; if {rel} itself was edited, restore it from the release instead (--force cannot help then)"
    return fix


def _check_pins(name: str, folder: Path, files: dict[str, str], fix: str) -> None:
    """Compare an artifact folder (its manifest's ``files`` and each file's size) with the pins,
    before any file is hashed. Raises ChecksumError naming the file, both hashes and ``fix`` (or, for
    an edited pins file, how to restore it: ``_pin_fix``)."""
    pins = pinned_files(name)
    if set(files) != set(pins):
        raise ChecksumError(f"{folder}/manifest.json lists {', '.join(sorted(files)) or 'no file'}, but the pinned "
                            f"record of {name} ({_rel(PINS_FILE)}) lists {', '.join(sorted(pins))}: it is not the "
                            f"shipped {name}; {_pin_fix(name, fix)}")
    for fname, pin in pins.items():
        path = folder / fname
        if files[fname] != pin["sha256"]:
            raise ChecksumError(f"{path} is not the pinned {name}/{fname}: {_rel(PINS_FILE)} pins sha256 "
                                f"{pin['sha256']} ({pin['size']:,} bytes), its manifest says {files[fname]}; "
                                f"{_pin_fix(name, fix)}")
        if path.is_file() and path.stat().st_size != pin["size"]:
            raise ChecksumError(f"{path} has {path.stat().st_size:,} bytes, the pinned {name}/{fname} has "
                                f"{pin['size']:,} (sha256 {pin['sha256']}); not hashed; {_pin_fix(name, fix)}")


def verify_artifact(name: str, root: Path | None = None, *, pinned: bool | None = None) -> dict:
    """Check every file of an artifact against its manifest and, for the shipped folder, against
    the pinned record ``g2c/assets/pins.json``; return the manifest.

    Args:
        pinned: also require the files the pins name (sizes first, then sha256). Default: only
            for the shipped ``artifacts/`` (a test's or a user's own root is theirs); the
            installers pass ``True`` for every source.

    Raises:
        ValueError: unknown name.
        ArtifactMissingError: the folder, manifest or a listed file is missing
            (the message says to run ``./checkpoints.sh``).
        ChecksumError: a file's sha256 differs (the message names the file and says to run
            ``./checkpoints.sh --force``); with pins, a file whose size or sha256 is not the
            pinned one, or a manifest listing other files (the message names the file, both
            hashes and the fix).
    """
    folder = artifact_dir(name, root)
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise ArtifactMissingError(f"artifact {canonical_name(name)} is missing ({manifest_path} not found): "
                                   "run ./checkpoints.sh to install it (or ./checkpoints.sh --train to rebuild it)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ChecksumError(f"{manifest_path} is corrupted ({exc}): run ./checkpoints.sh --force") from exc
    files = manifest_files(manifest, manifest_path)
    if pinned if pinned is not None else _is_shipped_root(root):
        _check_pins(canonical_name(name), folder, files,
                    "run ./checkpoints.sh --force to restore the pinned copy (from git or a trusted mirror)")
    for fname, expected in files.items():
        path = folder / fname
        if not path.is_file():
            raise ArtifactMissingError(f"{path} is missing: run ./checkpoints.sh to install it")
        got = sha256_file(path)
        if got != expected:
            raise ChecksumError(f"checksum mismatch for {path}: manifest says {expected}, file has {got}; "
                                "the file is corrupted or was edited. Run ./checkpoints.sh to restore it (it "
                                "replaces a file that fails its checksum)")
    return manifest


def pins_from_tree(root: Path | None = None, names: tuple[str, ...] | None = None) -> dict[str, dict[str, dict]]:
    """The pinned record of the artifacts installed under ``root`` (each verified against its
    own manifest first): ``{name: {file: {"sha256", "size"}}}``, for ``names`` (default: every
    artifact present). The tooling test compares this with ``pins.json``.

    Raises:
        ArtifactMissingError / ChecksumError: a named artifact is missing or damaged.
    """
    all_known = model_names() + drafter_names() + TOKENIZER_NAMES + CORPUS_NAMES
    if names is None:
        names = tuple(n for n in all_known if (artifact_dir(n, root) / "manifest.json").is_file())
    out = {}
    for name in names:
        name = canonical_name(name)
        files = verify_artifact(name, root, pinned=False)["files"]
        folder = artifact_dir(name, root)
        out[name] = {f: {"sha256": files[f], "size": (folder / f).stat().st_size} for f in sorted(files)}
    return out


def write_pins(update: dict[str, dict[str, dict]]) -> list[str]:
    """Merge ``update`` (as ``pins_from_tree`` returns) into ``pins.json``, atomically; return the
    names whose pin changed."""
    try:
        current = load_pins()
    except ChecksumError:
        current = {}
    changed = [n for n, v in update.items() if current.get(n) != v]
    merged = {**current, **update}
    text = json.dumps({"about": "sha256 and size of every shipped artifact file, checked on load and install "
                                "(g2c/assets/artifacts.py); regenerate with ./checkpoints.sh --train NAME or "
                                "--pin NAME",
                       "artifacts": dict(sorted(merged.items()))}, indent=1, sort_keys=False) + "\n"
    with atomic_write(PINS_FILE, "w") as f:
        f.write(text)
    return changed


def check_member_name(fname: object, where: object) -> str:
    """Refuse a manifest entry that is not a plain file name inside its artifact folder.

    A manifest owns files *in its own folder* only: an entry such as ``../../README.md``,
    ``/etc/passwd``, ``sub/file``, ``.`` or ``manifest.json`` itself would read or write
    outside what the manifest owns, so it is refused before any file is touched.

    Raises:
        ChecksumError: the entry is not a string, is empty, holds a path separator, starts
            with a dot, or is ``manifest.json``; the message names the entry and ``where``.
    """
    if (not isinstance(fname, str) or not fname or "/" in fname or "\\" in fname or fname.startswith(".")
            or fname == "manifest.json" or "\0" in fname or Path(fname).name != fname):
        raise ChecksumError(f"{where} lists an unsafe file name {fname!r}: a manifest may only name plain files "
                            "inside its own folder; use a manifest from ./checkpoints.sh or fix the mirror")
    return fname


def manifest_files(manifest: object, where: object) -> dict[str, str]:
    """The ``files`` table of a parsed manifest, checked: a dict of plain file names (see
    ``check_member_name``) to 64-digit hex sha256 strings.

    Raises:
        ChecksumError: the manifest is not a JSON object, has no ``files`` object, or an entry
            is unsafe or its checksum is not a sha256 hex string; the message names ``where``
            and says to run ``./checkpoints.sh --force``.
    """
    fix = "run ./checkpoints.sh --force to restore it (or fix the mirror's manifest)"
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ChecksumError(f"{where} has the wrong structure: expected a JSON object with a \"files\" object "
                            f"mapping file names to sha256; {fix}")
    files = manifest["files"]
    for fname, digest in files.items():
        check_member_name(fname, where)
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise ChecksumError(f"{where}: the checksum of {fname!r} is {digest!r}, not a 64-digit sha256 hex "
                                f"string; {fix}")
    return files


def _owned_by(folder: Path) -> set[str] | None:
    """The names an installed artifact's manifest owns (itself included); None when unreadable."""
    try:
        files = manifest_files(json.loads((folder / "manifest.json").read_text()), folder / "manifest.json")
    except (OSError, ValueError, ArtifactError):
        return None
    return set(files) | {"manifest.json"}


def is_verified(name: str, root: Path | None = None) -> bool:
    """True when the artifact is installed and every file matches its manifest (never raises
    for a missing or corrupted artifact: that is a False)."""
    try:
        verify_artifact(name, root)
    except ArtifactError:
        return False
    return True


def clean_artifact_leftovers(root: Path | None = None, *, log=None) -> list[str]:
    """Undo what a run killed inside ``write_artifact`` left behind, and say so through ``log``:
    a ``.tmp-<Name>-*`` staging folder is removed; a ``<Name>.old`` folder is moved back when
    ``<Name>`` itself is gone (killed between the two renames), else removed (a dangling
    ``.old`` link too); temporaries of ``g2c.course.files`` are removed. Returns one line per fix."""
    root = Path(root) if root is not None else ARTIFACTS_DIR
    lines = []
    for kind in ("models", "tokenizers", "corpora"):
        folder = root / kind
        if not folder.is_dir():
            continue
        for entry in sorted(folder.iterdir()):
            try:
                if entry.name.startswith(".tmp-"):
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                    lines.append(f"removed {entry}, the staging folder of an interrupted install")
                elif entry.name.endswith(".old"):
                    live = entry.with_name(entry.name[:-4])
                    if entry.is_dir() and not entry.is_symlink() and not live.exists() and not live.is_symlink():
                        os.replace(entry, live)
                        lines.append(f"moved {entry} back to {live.name}: an interrupted install had set it aside")
                    else:
                        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                        lines.append(f"removed {entry}, left over by an interrupted install")
            except OSError:
                continue
        lines += [f"removed {p}, left over by an interrupted write" for p in clean_leftovers(folder, recursive=True)]
    if log is not None:
        for line in lines:
            log(line)
    return lines


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_artifact(name: str, files: dict[str, bytes | Path], manifest: dict, *, root: Path | None = None,
                   force: bool = False) -> Path:
    """Write an artifact folder atomically: everything goes to a temp folder (each file fsynced),
    then one rename.

    ``manifest["files"]`` is filled with the sha256 of every file. A failed or interrupted run
    (an exception, Ctrl-C, a full disk) removes its temp folder and leaves the previous artifact
    as it was; a run killed outright leaves at most a ``.tmp-*`` folder or a ``<Name>.old``
    folder, which the next run cleans up or moves back (``clean_artifact_leftovers``), never a
    half-written artifact that passes verification. Files in an existing folder that its
    manifest does not own (a user's notes, say) are carried over into the new folder, never
    deleted; a file the old manifest owned and the new one does not is dropped with the old
    copy. Without a readable old manifest, every file the new manifest does not name is kept.
    Writing does not consult the pins (``verify_artifact`` and the installers do).

    Raises:
        FileExistsError: a verified artifact is already there and ``force`` is False.
        ChecksumError: a file name is not a plain name inside the folder (``../x``, ``a/b``,
            ``.hidden``, ``manifest.json``): nothing is written.
        OSError: the folder cannot be written (read-only, full disk): nothing changed.
    """
    dest = artifact_dir(name, root)
    for fname in files:
        check_member_name(fname, f"write_artifact({canonical_name(name)!r})")
    if not force and is_verified(name, root):
        raise FileExistsError(f"{dest} already holds a verified {canonical_name(name)}; pass --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    clean_artifact_leftovers(dest.parent.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}-", dir=dest.parent))
    try:
        if dest.is_dir():  # keep what the old manifest does not own
            owned = _owned_by(dest) or {"manifest.json"}
            for entry in dest.iterdir():
                if entry.name not in owned and entry.name not in files:
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.copytree(entry, tmp / entry.name, symlinks=True)
                    else:
                        shutil.copy2(entry, tmp / entry.name, follow_symlinks=False)
        hashes = {}
        for fname, content in files.items():
            if isinstance(content, Path):
                shutil.copyfile(content, tmp / fname)
            else:
                with open(tmp / fname, "wb") as f:
                    f.write(content)
            _fsync_file(tmp / fname)
            hashes[fname] = sha256_file(tmp / fname)
        with open(tmp / "manifest.json", "w") as f:
            f.write(json.dumps({**manifest, "files": hashes}, indent=2) + "\n")
        _fsync_file(tmp / "manifest.json")
        fsync_dir(tmp)
        if dest.exists():
            old = dest.with_name(dest.name + ".old")
            os.replace(dest, old)
            try:
                os.replace(tmp, dest)
            except BaseException:
                os.replace(old, dest)  # put the previous copy back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
        fsync_dir(dest.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def load_tokenizer(name: str = "StoryTokenizer", *, root: Path | None = None):
    """Verify and load a tokenizer artifact as a ``g2c.tokenizer.BPETokenizer``.

    Raises:
        ArtifactMissingError / ChecksumError: see ``verify_artifact``.
    """
    from g2c.tokenizer.bpe import BPETokenizer

    verify_artifact(name, root)
    return BPETokenizer.load(artifact_dir(name, root) / "tokenizer.json")


def load_story_tokenizer(*, root: Path | None = None):
    """The course's StoryTokenizer (byte-level BPE, vocab 4096), verified against its manifest.

    Raises:
        ArtifactMissingError: the artifact is missing (run ``./checkpoints.sh``).
        ChecksumError: its checksum does not match the manifest (run ``./checkpoints.sh``: it restores a
            file that fails its checksum).
    """
    return load_tokenizer("StoryTokenizer", root=root)


def model_state_to_bytes(model, dtype: torch.dtype = torch.float16) -> bytes:
    """Serialise a course model's parameters as safetensors in ``dtype``."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()})


NOT_A_DEVICE = "not a device name; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"


def device_problem(device: str | torch.device) -> str | None:
    """Why ``device`` cannot be used on this machine, or None (``"auto"`` always can): ``NOT_A_DEVICE`` for a
    name torch does not parse, else what is missing (CUDA, a CUDA index, MPS, a device type the course does not
    run on). Provided code's one device check: it must not depend on an exercise (``g2c.nn.resolve_device`` is
    module 03's), so ``python -m g2c.specdec`` and the loaders call this."""
    text = str(device).strip().lower()
    if text == "auto":
        return None
    try:
        dev = torch.device(text)
    except (RuntimeError, TypeError):
        return NOT_A_DEVICE
    if dev.type not in ("cpu", "cuda", "mps"):
        return f"the course runs on 'cpu', 'cuda' and 'mps', not {dev.type!r}; use 'auto'"
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available on this machine; use 'auto' or 'cpu'"
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        return f"this machine has {torch.cuda.device_count()} CUDA device(s); use 'cuda:0' or 'auto'"
    mps = getattr(torch.backends, "mps", None)
    if dev.type == "mps" and not (mps is not None and mps.is_available()):
        return "MPS (Apple's GPU) is not available on this machine; use 'auto' or 'cpu'"
    return None


def _device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` (``"auto"``: CUDA, then MPS, then the CPU).

    Raises:
        ValueError: ``"unknown device 'tpu': ..."`` for a name torch does not parse, ``"device 'cuda': ..."`` for
            one this machine lacks (``device_problem`` says why).
    """
    if str(device) != "auto":
        problem = device_problem(device)
        if problem:
            raise ValueError(f"{'unknown device' if problem == NOT_A_DEVICE else 'device'} {device!r}: {problem}")
        return torch.device(str(device).strip().lower())
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    return torch.device("mps" if mps is not None and mps.is_available() else "cpu")


LOAD_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(name: str, *, device: str | torch.device = "auto", root: Path | None = None,
               dtype: torch.dtype | str = torch.float32):
    """Load a verified StoryLM, or a shipped drafter, in eval mode, with its tokenizer.

    Args:
        name: ``StoryLM-1M``, ``StoryLM-5M``, ``StoryLM-30M``, or a drafter
            (``drafter_names()``: ``StoryLM-1M-distilled``, ``StoryLM-5M-MTP``,
            ``StoryLM-30M-MTP``, ``StoryLM-30M-EAGLE``, and the specdec-lineage drafters
            ``StoryLM-30M-Medusa``, ``StoryLM-30M-EAGLE3``, ``StoryLM-30M-Block``); case-insensitive.
        device: ``"auto"`` (CUDA, MPS, CPU) or an explicit device.
        dtype: parameter dtype, ``torch.float32`` (default: the exactness tests use it),
            ``torch.bfloat16`` (CPU and CUDA: half the bytes per decode step) or
            ``torch.float16`` (MPS, where bfloat16 support is partial; slow on CPU), or
            their names as strings. The files hold float16, so float16 is lossless and
            bfloat16 rounds each weight once (8 mantissa bits). Half-precision greedy
            output can differ from float32 where two logits nearly tie.

    Returns:
        (model, tokenizer). A ladder model or ``StoryLM-1M-distilled`` is a
        ``TransformerLM``; ``*-MTP`` is a ``g2c.specdec.MTPHead`` and ``*-EAGLE`` a
        ``g2c.specdec.sampling.eagle.FeatureDrafter``, ``*-Medusa`` / ``*-EAGLE3`` / ``*-Block`` a
        ``g2c.specdec.lineage`` ``MedusaHeads`` / ``Eagle3Head`` / ``BlockHead``, each on its frozen
        base (``head.base``, loaded from its own artifact, same device and dtype; from ``root``
        when ``root`` holds it, else from ``artifacts/``: a budgeted run's ``runs/budget-<T>/``
        holds drafters only).

    Raises:
        ValueError: unknown name (the message lists the names) or not a model; a dtype
            other than float32/bfloat16/float16 (the message lists them); a device torch does
            not know or this machine lacks ("device ... is not available"); an ablation trained on
            tokens only (``--variant tokens``: "trained on tokens only"), which is measured, not served.
        ArtifactMissingError: missing files (the drafter's or its base's); run ``./checkpoints.sh``.
        ChecksumError: corrupted files; run ``./checkpoints.sh`` (it restores them).
    """
    from g2c.transformer import StoryLMConfig

    known = {m.lower(): m for m in model_names() + drafter_names()}
    if str(name).strip().lower() not in known:
        raise ValueError(f"unknown model {name!r}; models: {', '.join(known.values())}")
    name = known[str(name).strip().lower()]
    dtype = LOAD_DTYPES.get(dtype, dtype) if isinstance(dtype, str) else dtype
    if dtype not in LOAD_DTYPES.values():
        raise ValueError(f"load_model: dtype {dtype!r} is not supported; use one of {', '.join(LOAD_DTYPES)}")
    verify_artifact(name, root)
    folder = artifact_dir(name, root)
    cfg = json.loads((folder / "config.json").read_text())
    if cfg.get("inputs", "features") == "tokens":
        raise ValueError(f"load_model: {name} in {folder} is an ablation trained on tokens only "
                         "(--variant tokens); it is measured by its validation agreement in its manifest, "
                         "not served as a drafter")
    if cfg.get("inputs", "features") != "features":
        raise ValueError(f"load_model: {folder / 'config.json'} says inputs={cfg['inputs']!r}, which this version "
                         "does not know; run ./checkpoints.sh --force (it restores the shipped artifacts)")
    state = load_file(str(folder / "model.safetensors"))
    kind = DRAFTERS.get(name, {}).get("kind", "lm")
    if kind == "lm":
        model = StoryLMConfig.from_dict({**cfg, "name": name}).build()
        tokenizer_name = cfg.get("tokenizer", "StoryTokenizer")
    else:
        # a budgeted retraining's tree (runs/budget-<T>/, ./checkpoints.sh --budget) holds drafters only:
        # their base is then the shipped one, verified against its own manifest like any artifact
        base_root = root if root is None or artifact_dir(cfg["base"], root).exists() else None
        base, tokenizer = load_model(cfg["base"], device=device, root=base_root, dtype=dtype)
        if kind in ("medusa", "eagle3", "block"):
            from g2c.specdec.lineage import BlockHead, Eagle3Head, MedusaHeads

            head_class = {"medusa": MedusaHeads, "eagle3": Eagle3Head, "block": BlockHead}[kind]
            model = head_class.from_config(base, cfg).to("cpu")                             # weights replaced below
        else:
            if kind == "mtp":
                from g2c.specdec import MTPHead as head_class
            else:
                from g2c.specdec.sampling.eagle import FeatureDrafter as head_class
            model = head_class(base, generator=torch.Generator().manual_seed(0)).to("cpu")  # weights replaced below
        tokenizer_name = None
    model.load_state_dict({k: v.float() for k, v in state.items()})
    model.eval()
    model.to(_device(device), dtype=dtype)
    if tokenizer_name is None:
        return model, tokenizer
    tokenizer = load_tokenizer(tokenizer_name, root=root)
    if tokenizer.vocab_size != model.vocab_size:
        raise ValueError(f"{name}: tokenizer has {tokenizer.vocab_size} ids but the model {model.vocab_size}")
    return model, tokenizer


def save_model_file(model, path: Path) -> None:
    """Write a model's weights as float16 safetensors to ``path``, atomically (helper for tests/tools)."""
    from g2c.course.files import write_bytes_atomic

    write_bytes_atomic(path, model_state_to_bytes(model))
