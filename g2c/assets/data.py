"""TinyStories for the course: read, split by story hash, and cache as token streams.

``./datasets.sh`` is the command-line entry (``python -m g2c.assets.data``). Sources, in order:

1. ``--from PATH`` or ``$G2C_TINYSTORIES``: a ``.txt`` or ``.txt.xz`` file with stories
   separated by a line ``<|endoftext|>``;
2. ``--hub``: the Hugging Face dataset ``roneneldan/TinyStories`` through the ``datasets``
   library (needs network; ``--tiny`` takes its first 10,000 stories);
3. otherwise the TinyStories sample shipped in the repository, the verified corpus artifact
   ``artifacts/corpora/TinyStories-sample`` (8,051 stories, CDLA-Sharing-1.0; the corpus the
   StoryTokenizer and the StoryLM ladder were trained on). This is the default and works offline.

Layout under ``data/tinystories/`` (gitignored)::

    train.txt, val.txt        stories joined by "\\n<|endoftext|>\\n"
    manifest.json             source, its sha256, split rule, counts, file hashes
    train.bin, val.bin        uint16 token streams (story ids, then <|endoftext|>), and
    tokens.json               the tokenizer sha256 they were made with
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import lzma
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from g2c.assets.artifacts import ArtifactError, corpus_path, sha256_file
from g2c.course import REPO_ROOT
from g2c.course.files import atomic_path, clean_leftovers, write_problem, write_text_atomic
from g2c.tokenizer.bpe import EOT  # the end-of-text token, defined once by module 04

DATA_DIR = REPO_ROOT / "data" / "tinystories"
HF_DATASET = "roneneldan/TinyStories"
CORPUS = "TinyStories-sample"  # the embedded default source (a verified artifact)
VAL_PERCENT = 5
TINY_STORIES = 10_000  # stories taken from the Hugging Face train split with --tiny

__all__ = ["DATA_DIR", "check_source_file", "is_validation", "load_split_text", "load_token_stream", "prepare",
           "read_stories", "split_stories", "tokenize_splits", "validation_prompts"]


def read_stories(path: str | Path) -> list[str]:
    """Stories from a ``.txt`` or ``.txt.xz`` file separated by lines ``<|endoftext|>``.

    Returns:
        list of stories (stripped; empty ones dropped).

    Raises:
        FileNotFoundError: no such file.
        ValueError: the path is a directory or not a regular file (a device, a pipe); a ``.xz``
            file that is not xz data or is truncated; text that is not UTF-8 (the message gives
            the byte offset); a file that holds no story. Each message names the file and the fix.
        PermissionError: the file cannot be read.
    """
    path = check_source_file(path)
    try:
        if path.suffix == ".xz":
            with lzma.open(path, "rb") as f:
                raw = f.read()
        else:
            raw = path.read_bytes()
    except lzma.LZMAError as exc:
        raise ValueError(f"{path} is not an xz file ({exc}): pass the plain .txt, or compress it with `xz -k`") from exc
    except EOFError as exc:
        raise ValueError(f"{path} is a truncated xz file (it ends before the compressed stream does): copy or "
                         "download it again") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 4]!r}): convert it, "
                         f"e.g. `iconv -f latin1 -t utf-8 {path.name} > stories.txt`, then pass that file") from exc
    stories, current = [], []
    for line in text.split("\n"):
        if line.strip() == EOT:
            stories.append("\n".join(current).strip())
            current = []
        else:
            current.append(line)
    stories.append("\n".join(current).strip())
    stories = [s for s in stories if s]
    if not stories:
        raise ValueError(f"{path} holds no stories (expected stories separated by a line {EOT})")
    return stories


def check_source_file(path: str | Path) -> Path:
    """``path`` as a ``Path`` when it is a regular file a source can be read from.

    Raises:
        FileNotFoundError: nothing at ``path``.
        ValueError: a directory, or not a regular file (a device, a pipe, a socket).
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"TinyStories source {path} is a directory: pass a .txt or .txt.xz file inside it")
    if not path.exists():
        raise FileNotFoundError(f"TinyStories source {path} does not exist: pass an existing .txt or .txt.xz file")
    if not path.is_file():
        raise ValueError(f"TinyStories source {path} is not a regular file (a device or a pipe?): pass a .txt or "
                         ".txt.xz file")
    return path


def is_validation(story: str) -> bool:
    """The deterministic split: a story is validation iff sha256(text) mod 100 < 5 (about 5%)."""
    return int.from_bytes(hashlib.sha256(story.encode("utf-8")).digest()[:8], "big") % 100 < VAL_PERCENT


def split_stories(stories: list[str]) -> tuple[list[str], list[str]]:
    """(train, val) by ``is_validation``, order kept."""
    train, val = [], []
    for s in stories:
        (val if is_validation(s) else train).append(s)
    return train, val


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_hf_stories(*, tiny: bool, loader: Callable | None = None) -> list[str]:
    """Stories from the Hugging Face dataset (train split; the first ``TINY_STORIES`` with tiny).

    Args:
        tiny: take only the first ``TINY_STORIES`` stories.
        loader: stand-in for ``datasets.load_dataset`` (tests pass a local fake).

    Raises:
        RuntimeError: the hub is unreachable; the message names ``--from``, ``$G2C_TINYSTORIES``
            and the shipped sample (``./datasets.sh`` without ``--hub``).
    """
    if loader is None:
        if not _hub_reachable():
            raise RuntimeError(
                "--hub: the Hugging Face hub is unreachable from this machine. "
                "Pass a local file with `./datasets.sh --from PATH` or set $G2C_TINYSTORIES, "
                f"or drop --hub to use the TinyStories sample shipped in artifacts/corpora/{CORPUS}.")
        from datasets import load_dataset as loader
    split = f"train[:{TINY_STORIES}]" if tiny else "train"
    ds = loader(HF_DATASET, split=split)
    return [s.strip() for s in ds["text"] if s and s.strip()]


def _describe(src: dict) -> str:
    kind = src.get("kind")
    if kind == "artifact":
        return f"the shipped {src.get('name', CORPUS)} artifact"
    if kind == "huggingface":
        return f"the Hugging Face dataset {src.get('dataset', HF_DATASET)}" + (" (--tiny)" if src.get("tiny") else "")
    return str(src.get("path", "a local file"))


def prepare(source: str | Path | None = None, *, tiny: bool = False, hub: bool = False, force: bool = False,
            out_dir: Path = DATA_DIR, hf_loader: Callable | None = None, corpus_root: Path | None = None,
            log=print) -> dict:
    """Write the train/validation split and its manifest; a no-op when already done.

    Args:
        source: a local file, else ``$G2C_TINYSTORIES``; without either (and without ``hub``)
            the TinyStories sample shipped as the artifact ``artifacts/corpora/TinyStories-sample``.
        tiny: with the Hugging Face source, only its first ``TINY_STORIES`` stories (the shipped
            sample has 8,051 stories either way).
        hub: read the Hugging Face dataset ``roneneldan/TinyStories`` (needs network).
        force: redo even if the data is already prepared.
        out_dir: where to write (default ``data/tinystories``).
        corpus_root: artifacts root holding the shipped sample (tests; default ``artifacts/``).

    Without a source or ``hub``, intact prepared data is kept whatever it was prepared from
    (nothing to do); with one, it is redone when the source differs.

    Returns:
        the manifest dict (``"skipped": True`` when nothing was done).

    Raises:
        ValueError: both a file (``--from``/``$G2C_TINYSTORIES``) and ``hub``; pick one.
        ValueError: the source gives an empty train or validation split (checked before anything is written).
        FileNotFoundError: the file source does not exist, or the shipped sample is missing or
            corrupted (the message says to run ``./checkpoints.sh``, which restores it).
        RuntimeError: ``hub`` and the hub is unreachable (see ``load_hf_stories``).
    """
    source = source or os.environ.get("G2C_TINYSTORIES") or None
    explicit = source is not None or hub
    if source and hub:
        raise ValueError(f"two TinyStories sources: the file {source} (--from or $G2C_TINYSTORIES) and --hub; "
                         "pick one (unset G2C_TINYSTORIES to use --hub)")
    out_dir = Path(out_dir)
    manifest_path = out_dir / "manifest.json"
    clean_leftovers(out_dir, extra=("*.tmp",), log=lambda line: log(f"datasets: {line}"))
    if source:
        check_source_file(source)
    if source:
        src_id = {"kind": "file", "path": str(Path(source).resolve()), "sha256": sha256_file(Path(source))}
    elif hub:
        src_id = {"kind": "huggingface", "dataset": HF_DATASET, "tiny": tiny}
    else:
        try:
            source = corpus_path(CORPUS, root=corpus_root)
        except ArtifactError as exc:
            raise FileNotFoundError(f"the shipped TinyStories sample is unusable ({exc}). Run ./checkpoints.sh to "
                                    "restore it, or pass a file with --from PATH") from exc
        rel = source.relative_to(REPO_ROOT).as_posix() if source.is_relative_to(REPO_ROOT) else str(source)
        src_id = {"kind": "artifact", "name": CORPUS, "path": rel, "sha256": sha256_file(source)}
    if manifest_path.exists() and not force:
        try:
            old = json.loads(manifest_path.read_text())
            old_src = old.get("source", {})
            files_ok = all((out_dir / f).exists() and sha256_file(out_dir / f) == h for f, h in old["files"].items())
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError):
            old, old_src, files_ok = {}, {}, False
        if "sha256" in src_id:
            same = old_src.get("sha256") == src_id["sha256"]
        else:
            same = old_src.get("kind") == "huggingface" and old_src.get("tiny") == tiny
        if files_ok and (same or not explicit):
            log(f"datasets: {out_dir} already prepared from {_describe(old_src)} "
                f"({old['train_stories']} train / {old['val_stories']} val stories); nothing to do (--force redoes it)")
            return {**old, "skipped": True}
    t0 = time.time()
    stories = read_stories(source) if source else load_hf_stories(tiny=tiny, loader=hf_loader)
    train, val = split_stories(tqdm(stories, desc="split", unit="story", disable=None))
    if not train or not val:
        # Checked before anything is written: a too-small source must not replace good data.
        raise ValueError(f"{_describe(src_id)} gives {len(train)} train / {len(val)} validation stories; both "
                         f"splits need at least one (about {VAL_PERCENT}% go to validation, so use a file with "
                         "dozens of stories separated by lines <|endoftext|>). Nothing was changed.")
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    # Both splits are written in full to temporaries first and renamed only then: a full disk or
    # Ctrl-C leaves the previous split and manifest. (A kill between the two renames leaves files
    # whose sha256 the old manifest does not vouch for, so the next run redoes them.)
    with atomic_path(out_dir / "train.txt") as tmp_train, atomic_path(out_dir / "val.txt") as tmp_val:
        for tmp, part in ((tmp_train, train), (tmp_val, val)):
            tmp.write_text(f"\n{EOT}\n".join(part) + f"\n{EOT}\n", encoding="utf-8")
        files = {"train.txt": sha256_file(tmp_train), "val.txt": sha256_file(tmp_val)}
    for stale in ("train.bin", "val.bin", "tokens.json"):
        (out_dir / stale).unlink(missing_ok=True)
    manifest = {
        "source": src_id,
        "split_rule": f"validation iff int(sha256(story utf-8)[:8 bytes], big-endian) % 100 < {VAL_PERCENT}",
        "train_stories": len(train), "val_stories": len(val),
        "train_chars": sum(map(len, train)), "val_chars": sum(map(len, val)),
        "files": files,
    }
    write_text_atomic(manifest_path, json.dumps(manifest, indent=2) + "\n")
    log(f"datasets: wrote {len(train)} train / {len(val)} val stories to {out_dir} in {time.time() - t0:.1f}s "
        f"(from {_describe(src_id)})")
    return manifest


def load_split_text(split: str, *, data_dir: Path = DATA_DIR) -> list[str]:
    """Stories of a prepared split (``"train"`` or ``"val"``).

    Raises:
        FileNotFoundError: not prepared yet (run ``./datasets.sh``).
    """
    path = Path(data_dir) / f"{split}.txt"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run ./datasets.sh first (it prepares the TinyStories sample "
                                "shipped in artifacts/, offline)")
    return read_stories(path)


def tokenize_splits(tokenizer, *, data_dir: Path = DATA_DIR, force: bool = False, log=print) -> dict[str, int]:
    """Cache both splits as ``uint16`` token streams (each story's ids, then ``<|endoftext|>``).

    Skipped when the cache was made with the same tokenizer (by sha256 of its JSON).

    Returns:
        {"train": n_tokens, "val": n_tokens}.

    Raises:
        ValueError: the tokenizer has more than 65,536 ids (they would not fit in uint16).
    """
    if tokenizer.vocab_size > 1 << 16:
        raise ValueError(f"vocab of {tokenizer.vocab_size} ids does not fit the uint16 cache")
    data_dir = Path(data_dir)
    tok_sha = hashlib.sha256(tokenizer.to_tokenizers().to_str().encode()).hexdigest()
    meta_path = data_dir / "tokens.json"
    if meta_path.exists() and not force:
        try:
            meta = json.loads(meta_path.read_text())
            same_tokenizer = meta.get("tokenizer_sha256") == tok_sha
        except (ValueError, UnicodeDecodeError, AttributeError):
            meta, same_tokenizer = {}, False
            log(f"datasets: {meta_path} is corrupted; re-tokenizing")
        if same_tokenizer:
            problems = [p for p in (_stream_problem(s, data_dir, meta) for s in ("train", "val")) if p]
            if not problems:
                return {s: int(meta["tokens"][s]) for s in ("train", "val")}
            log(f"datasets: {'; '.join(problems)}; re-tokenizing")
    counts, files = {}, {}
    for split in ("train", "val"):
        stories = load_split_text(split, data_dir=data_dir)
        ids: list[int] = []
        for i in tqdm(range(0, len(stories), 512), desc=f"tokenize {split}", unit="batch", disable=None):
            for row in tokenizer.encode_batch_fast(stories[i:i + 512]):
                ids.extend(row)
                ids.append(tokenizer.eot_id)
        arr = np.asarray(ids, dtype=np.uint16)
        with atomic_path(data_dir / f"{split}.bin") as tmp:
            arr.tofile(tmp)
            files[f"{split}.bin"] = {"sha256": sha256_file(tmp), "bytes": tmp.stat().st_size}
        counts[split] = int(arr.size)
    write_text_atomic(meta_path, json.dumps({"tokenizer_sha256": tok_sha, "tokens": counts, "files": files},
                                            indent=2) + "\n")
    log(f"datasets: tokenized train {counts['train']:,} / val {counts['val']:,} tokens")
    return counts


def validation_prompts(tokenizer, n: int, num_tokens: int, *, data_dir: Path = DATA_DIR) -> list[list[int]]:
    """Benchmark prompts: the first ``num_tokens`` token ids of the first ``n`` validation stories
    that are at least that long (fewer if the split has fewer).

    Raises:
        FileNotFoundError: the split is not prepared (the message names ``./datasets.sh``).
        ValueError: ``n`` or ``num_tokens`` below 1, or no validation story has ``num_tokens``
            tokens ("no validation story has N tokens (the longest has L)": a benchmark would
            otherwise time zero prompts and divide by zero).
    """
    if n < 1 or num_tokens < 1:
        raise ValueError(f"validation_prompts: need n >= 1 prompts of num_tokens >= 1 tokens, got n={n}, "
                         f"num_tokens={num_tokens}")
    out: list[list[int]] = []
    longest = 0
    for story in load_split_text("val", data_dir=data_dir):
        ids = tokenizer.encode(story)
        longest = max(longest, len(ids))
        if len(ids) >= num_tokens:
            out.append(list(ids[:num_tokens]))
        if len(out) == n:
            break
    if not out:
        raise ValueError(f"no validation story has {num_tokens:,} tokens (the longest has {longest:,}): "
                         f"ask for at most {longest:,} prompt tokens")
    return out


_VERIFIED: dict[tuple, bool] = {}  # (path, size, mtime_ns, sha256) already hashed in this process


def _stream_problem(split: str, data_dir: Path, meta: dict) -> str | None:
    """Why the cached ``<split>.bin`` cannot be trusted, or None when it matches the size and
    sha256 that ``tokens.json`` recorded for it (hashed once per process per file version)."""
    path = Path(data_dir) / f"{split}.bin"
    record = meta.get("files", {}).get(path.name) if isinstance(meta.get("files"), dict) else None
    if not path.is_file():
        return f"{path} is missing"
    if not isinstance(record, dict) or not isinstance(meta.get("tokens"), dict) or split not in meta["tokens"]:
        return f"{path} has no recorded sha256 in tokens.json (made by an older ./datasets.sh)"
    stat = path.stat()
    if stat.st_size != record.get("bytes"):
        return f"{path} has {stat.st_size:,} bytes, tokens.json recorded {record.get('bytes')!r} (truncated?)"
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, record.get("sha256"))
    if key not in _VERIFIED:
        if sha256_file(path) != record.get("sha256"):
            return f"{path} does not match the sha256 recorded in tokens.json (corrupted)"
        _VERIFIED[key] = True
    return None


def load_token_stream(split: str, *, data_dir: Path = DATA_DIR) -> np.memmap:
    """The cached ``uint16`` stream of a split, memory-mapped, after checking it against the
    size and sha256 recorded in ``tokens.json`` (a truncated or bit-flipped cache is refused).

    Raises:
        ValueError: ``split`` is not ``"train"`` or ``"val"``.
        FileNotFoundError: not tokenized yet (``./datasets.sh`` does it once the tokenizer exists).
        ValueError: the cache does not match its record (or has none): the message names the file
            and says to run ``./datasets.sh``, which re-tokenizes it.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split {split!r} is not 'train' or 'val'")
    path = Path(data_dir) / f"{split}.bin"
    meta_path = Path(data_dir) / "tokens.json"
    if not path.exists() or not meta_path.exists():
        raise FileNotFoundError(f"{path if not path.exists() else meta_path} is missing: run ./datasets.sh "
                                "(it tokenizes once the StoryTokenizer exists)")
    try:
        meta = json.loads(meta_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{meta_path} is corrupted ({exc}): run ./datasets.sh to re-tokenize") from exc
    problem = _stream_problem(split, Path(data_dir), meta if isinstance(meta, dict) else {})
    if problem:
        raise ValueError(f"token cache refused: {problem}. Run ./datasets.sh to re-tokenize it")
    return np.memmap(path, dtype=np.uint16, mode="r")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./datasets.sh", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Prepare TinyStories under data/tinystories: a train/validation split by story hash, "
                    "then uint16 token streams once the StoryTokenizer exists.",
        epilog=f"""sources, first match wins:
  --from PATH or $G2C_TINYSTORIES   a local .txt or .txt.xz file (stories separated by a line <|endoftext|>)
  --hub                             the Hugging Face dataset {HF_DATASET} (network; with --tiny its
                                    first {TINY_STORIES:,} stories)
  (default)                         the TinyStories sample shipped in artifacts/corpora/{CORPUS}
                                    (8,051 stories, CDLA-Sharing-1.0; offline)
Already prepared data is kept ("nothing to do"); --force redoes it.""")
    ap.add_argument("--tiny", action="store_true",
                    help=f"with --hub: only the first {TINY_STORIES:,} stories (the shipped sample is small already)")
    ap.add_argument("--from", dest="source", help="local .txt or .txt.xz file (default: $G2C_TINYSTORIES)")
    ap.add_argument("--hub", action="store_true", help=f"download {HF_DATASET} from Hugging Face")
    ap.add_argument("--force", action="store_true", help="redo the split and the token cache")
    args = ap.parse_args(argv)
    if args.tiny and not args.hub and args.source is None and not os.environ.get("G2C_TINYSTORIES"):
        # the seed's command (./datasets.sh --tiny) stays valid: the shipped sample is the small corpus offline
        print(f"datasets: note: --tiny cuts the Hugging Face download (--hub) to {TINY_STORIES:,} stories; without "
              "--hub the shipped sample (8,051 stories) is used, small already", file=sys.stderr)
    if args.source is not None and not args.source.strip():   # --from "": it fell back to the default source
        ap.error("--from '': give the path of a .txt or .txt.xz file, or leave --from out for the shipped sample")
    try:
        return _run(args)
    except KeyboardInterrupt:
        print("\ndatasets: interrupted; the prepared files are the previous ones or complete new ones (nothing "
              "half-written): run ./datasets.sh again to finish", file=sys.stderr)
        return 130


def _os_message(exc: OSError) -> str:
    """A write failure (full disk, read-only) with its fix; other OS errors keep their own words."""
    if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EACCES, errno.EPERM, errno.EROFS,
                                       getattr(errno, "EDQUOT", -1)) and not isinstance(exc, FileNotFoundError):
        return write_problem(exc)
    return str(exc)


def _run(args) -> int:
    try:
        manifest = prepare(args.source, tiny=args.tiny, hub=args.hub, force=args.force)
    except OSError as exc:  # FileNotFoundError and PermissionError are OSErrors
        print(f"datasets: error: {_os_message(exc)}", file=sys.stderr)
        return 1
    except (ValueError, RuntimeError) as exc:
        print(f"datasets: error: {exc}", file=sys.stderr)
        return 1
    try:
        from g2c.assets.artifacts import load_tokenizer
        tok = load_tokenizer("StoryTokenizer")
    except (FileNotFoundError, ValueError) as exc:
        print(f"datasets: token cache not built ({exc})")
        return 0
    try:
        counts = tokenize_splits(tok, force=args.force and not manifest.get("skipped"))
    except OSError as exc:
        print(f"datasets: error: tokenizing failed: {_os_message(exc)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"datasets: error: tokenizing failed: {exc}; run ./datasets.sh --force to redo the split",
              file=sys.stderr)
        return 1
    print(f"datasets: token streams ready: train {counts['train']:,}, val {counts['val']:,} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
