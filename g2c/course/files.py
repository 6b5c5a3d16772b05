"""Atomic file writes for every tool that writes into the checkout (datasets, token caches,
artifacts, GGUF exports, notebook copies, generated modules, bench outputs).

A write goes to a temporary file *in the target folder* (same file system, so the final
``os.replace`` is atomic), is flushed and ``fsync``-ed, and is renamed over the target only
when it is complete. Any failure on the way (an exception, ``KeyboardInterrupt``, a full
disk) removes the temporary and leaves the previous file untouched: a reader sees the old
file or the new one, never half of one. A crash that kills the process before the cleanup
(``kill -9``, power loss) can leave a temporary behind; its name ends ``.g2c-tmp-XXXX<suffix>``
and starts with a dot, and ``clean_leftovers`` removes such files on the next run and says so.

    with atomic_write(path, "w") as f:        # a file object
        f.write(text)
    with atomic_path(path) as tmp:            # a path, for writers that want one (torch.save,
        torch.save(state, tmp)                # numpy tofile, matplotlib savefig)
    write_text_atomic(path, text); write_bytes_atomic(path, data)

``write_problem(exc, path)`` turns the ``OSError`` of a failed write into one line naming the
path and the fix (disk full, read-only, permission), for the scripts' error messages.
Tooling only: course exercises never import this (the layering test enforces it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

__all__ = ["TMP_MARK", "atomic_path", "atomic_write", "check_writable", "clean_leftovers", "fsync_dir",
           "temp_name", "write_bytes_atomic", "write_problem", "write_text_atomic"]

TMP_MARK = ".g2c-tmp-"  # every temporary this module makes has it in its name


def temp_name(path: Path) -> Path:
    """A fresh temporary beside ``path`` that keeps its suffix (``.fig.g2c-tmp-1a2b.png``), so
    writers that pick a format from the extension (matplotlib) still do."""
    path = Path(path)
    return path.with_name(f".{path.stem}{TMP_MARK}{secrets.token_hex(4)}{path.suffix}")


def fsync_dir(folder: Path) -> None:
    """``fsync`` a folder so a rename inside it survives a crash (a no-op where folders cannot
    be opened, e.g. Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, mkdir: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block ends normally, fsync it and
    rename it over ``path``. On any exception (``KeyboardInterrupt`` included) the temporary
    is removed and ``path`` keeps its previous content (or stays absent).

    Raises:
        whatever the block raises; ``FileNotFoundError`` when the block wrote nothing to the
        temporary (a writer that silently failed).
    """
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(path)
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"nothing was written for {path}")
        if tmp.is_file():
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if tmp.is_dir() and not tmp.is_symlink():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8",
                 newline: str | None = None, mkdir: bool = True):
    """Open a temporary beside ``path`` for writing (``mode`` ``"w"`` or ``"wb"``), yield the
    file object, and on a normal exit flush, fsync and rename it over ``path``.

    Raises:
        ValueError: ``mode`` is not ``"w"`` or ``"wb"``.
        whatever the block or the write raises (``OSError`` with ``errno.ENOSPC`` for a full
        disk); the temporary is removed first and ``path`` is unchanged.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode {mode!r} is not 'w' or 'wb'")
    with atomic_path(path, mkdir=mkdir) as tmp:
        kwargs = {} if mode == "wb" else {"encoding": encoding, "newline": newline}
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()


def write_text_atomic(path: str | os.PathLike, text: str, *, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (see ``atomic_write``); return the path."""
    with atomic_write(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see ``atomic_write``); return the path."""
    with atomic_write(path, "wb") as f:
        f.write(data)
    return Path(path)


def clean_leftovers(folder: str | os.PathLike, *, recursive: bool = False, extra: tuple[str, ...] = (),
                    log=None) -> list[Path]:
    """Remove the temporaries an earlier crashed run left in ``folder`` (names holding
    ``TMP_MARK``, plus the glob patterns in ``extra``, e.g. ``"*.tmp"``) and say so through
    ``log`` (one line each). A missing folder has none. Returns what was removed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    glob = folder.rglob if recursive else folder.glob
    found = {p for p in glob(f"*{TMP_MARK}*")}
    for pattern in extra:
        found |= set(glob(pattern))
    removed = []
    for p in sorted(found):
        try:
            if p.is_dir() and not p.is_symlink():
                import shutil

                shutil.rmtree(p)
            else:
                p.unlink()
        except OSError:
            continue
        removed.append(p)
        if log is not None:
            log(f"removed {p}, left over by an interrupted earlier run")
    return removed


def check_writable(folder: str | os.PathLike, what: str = "output") -> None:
    """Refuse early when ``folder`` (or, if it does not exist yet, its nearest existing
    parent) cannot be written: before minutes of work whose result could not be saved.

    Raises:
        PermissionError: the message names the folder and the fix.
    """
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"cannot write the {what} folder {folder} ({probe} is read-only or "
                                            "not yours): make it writable (chmod u+w, or a writable copy of "
                                            "the checkout) or choose another folder", str(folder))


def write_problem(exc: BaseException, path: str | os.PathLike | None = None) -> str:
    """One line for a failed write: what happened to which path and the fix."""
    where = path if path is not None else getattr(exc, "filename", None) or "the output"
    code = getattr(exc, "errno", None)
    if isinstance(exc, PermissionError) and str(exc.strerror or "").startswith("cannot write"):
        return str(exc.strerror)  # from check_writable: already one line with the fix
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return (f"the disk is full while writing {where}: free some space (or choose a folder on another disk) "
                "and run it again; the previous file, if any, is unchanged")
    if code == errno.EFBIG:
        return (f"the file-size limit of this shell (ulimit -f) is too small to write {where}: raise it (ulimit -f "
                "unlimited) or run it where files may grow; the previous file, if any, is unchanged")
    if code == errno.ENAMETOOLONG:
        return f"the name {where} is too long for the file system: choose a shorter one"
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"cannot write {where}: the folder is read-only or not yours; make it writable (chmod u+w, or "
                "work in a writable copy of the checkout) or choose another output folder")
    return f"could not write {where}: {getattr(exc, 'strerror', None) or exc}"
