"""The shipped artifacts: the TinyStories sample, the StoryTokenizer and the StoryLM ladder,
verified by sha256.

Layout (CONVENTIONS §4-5)::

    artifacts/corpora/TinyStories-sample/{tinystories-collected.txt.xz, LICENSE.md, manifest.json}
    artifacts/tokenizers/StoryTokenizer/{tokenizer.json, manifest.json}
    artifacts/models/StoryLM-{1M,5M,30M}/{model.safetensors, config.json, manifest.json}

Every ``manifest.json`` lists the sha256 of each other file in its folder. Weights are
float16 safetensors (never unpickled) and are loaded into float32 models.
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

ARTIFACTS_DIR = REPO_ROOT / "artifacts"
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
           "DRAFTERS", "LOAD_DTYPES", "TOKENIZER_NAMES", "artifact_dir", "artifact_kind", "canonical_name",
           "check_member_name", "corpus_path", "drafter_names", "is_verified", "load_model", "load_story_tokenizer",
           "load_tokenizer", "manifest_files", "model_names", "verify_artifact", "write_artifact"]


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
        ValueError: unknown name; the message lists every artifact name.
    """
    names = model_names() + drafter_names() + TOKENIZER_NAMES + CORPUS_NAMES
    for known in names:
        if known.lower() == str(name).strip().lower():
            return known
    raise ValueError(f"unknown artifact {name!r}; known: {', '.join(names)}")


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


def verify_artifact(name: str, root: Path | None = None) -> dict:
    """Check every file of an artifact against its manifest; return the manifest.

    Raises:
        ValueError: unknown name.
        ArtifactMissingError: the folder, manifest or a listed file is missing
            (the message says to run ``./checkpoints.sh``).
        ChecksumError: a file's sha256 differs (the message names the file and says to run
            ``./checkpoints.sh --force``).
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
    for fname, expected in files.items():
        path = folder / fname
        if not path.is_file():
            raise ArtifactMissingError(f"{path} is missing: run ./checkpoints.sh to install it")
        got = sha256_file(path)
        if got != expected:
            raise ChecksumError(f"checksum mismatch for {path}: manifest says {expected[:12]}…, file has {got[:12]}…; "
                                "the file is corrupted or was edited. Run ./checkpoints.sh --force to restore it")
    return manifest


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


def write_artifact(name: str, files: dict[str, bytes | Path], manifest: dict, *, root: Path | None = None,
                   force: bool = False) -> Path:
    """Write an artifact folder atomically: everything goes to a temp folder, then one rename.

    ``manifest["files"]`` is filled with the sha256 of every file. A killed run leaves at
    most a ``.tmp-*`` folder, never a half-written artifact that passes verification.
    Files in an existing folder that its manifest does not own (a user's notes, say) are
    carried over into the new folder, never deleted; a file the old manifest owned and the
    new one does not is dropped with the old copy. Without a readable old manifest, every
    file the new manifest does not name is kept.

    Raises:
        FileExistsError: a verified artifact is already there and ``force`` is False.
        ChecksumError: a file name is not a plain name inside the folder (``../x``, ``a/b``,
            ``.hidden``, ``manifest.json``): nothing is written.
    """
    dest = artifact_dir(name, root)
    for fname in files:
        check_member_name(fname, f"write_artifact({canonical_name(name)!r})")
    if not force and is_verified(name, root):
        raise FileExistsError(f"{dest} already holds a verified {canonical_name(name)}; pass --force to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
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
                (tmp / fname).write_bytes(content)
            hashes[fname] = sha256_file(tmp / fname)
        (tmp / "manifest.json").write_text(json.dumps({**manifest, "files": hashes}, indent=2) + "\n")
        if dest.exists():
            old = dest.with_name(dest.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
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
        ChecksumError: its checksum does not match the manifest (run ``./checkpoints.sh --force``).
    """
    return load_tokenizer("StoryTokenizer", root=root)


def model_state_to_bytes(model, dtype: torch.dtype = torch.float16) -> bytes:
    """Serialise a course model's parameters as safetensors in ``dtype``."""
    from safetensors.torch import save

    return save({k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()})


def _device(device: str | torch.device) -> torch.device:
    # Provided code must not depend on an exercise (g2c.nn.resolve_device is module 03's).
    if str(device) != "auto":
        try:
            dev = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'mps'") from exc
        available = {"cpu": True, "cuda": torch.cuda.is_available(),
                     "mps": getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()}
        if not available.get(dev.type, False):
            raise ValueError(f"device {device!r} is not available on this machine; use 'auto' or 'cpu'")
        return dev
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
        base (``head.base``, loaded from its own artifact, same device and dtype).

    Raises:
        ValueError: unknown name (the message lists the names) or not a model; a dtype
            other than float32/bfloat16/float16 (the message lists them); a device torch does
            not know or this machine lacks ("device ... is not available").
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
    state = load_file(str(folder / "model.safetensors"))
    kind = DRAFTERS.get(name, {}).get("kind", "lm")
    if kind == "lm":
        model = StoryLMConfig.from_dict({**cfg, "name": name}).build()
        tokenizer_name = cfg.get("tokenizer", "StoryTokenizer")
    else:
        base, tokenizer = load_model(cfg["base"], device=device, root=root, dtype=dtype)
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
    """Write a model's weights as float16 safetensors to ``path`` (helper for tests/tools)."""
    Path(path).write_bytes(model_state_to_bytes(model))
