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

__all__ = ["TMP_MARK", "atomic_path", "atomic_write", "check_output_path", "check_writable", "clean_leftovers",
           "fsync_dir", "temp_name", "write_bytes_atomic", "write_problem", "write_text_atomic"]

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


TEMP_EXTRA = 1 + len(TMP_MARK) + 8   # what ``temp_name`` adds to a file's name: the dot, the mark, 8 hex digits


def _name_max(folder: Path) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):          # no pathconf (Windows) or no answer: the common limit
        return 255


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest parent that exists (a part too long to look up counts as absent)."""
    probe = path
    while probe != probe.parent:
        try:
            if probe.exists():
                break
        except OSError:                         # ENAMETOOLONG and the like: not there
            pass
        probe = probe.parent
    return probe


def _cannot(code: int, text: str, path: Path, kind: type = OSError) -> OSError:
    """An ``OSError`` (of the errno's own class: ``PermissionError`` for EACCES, ...) whose message is ``text``,
    marked ``checked`` so ``write_problem`` passes its one line through."""
    exc = kind(code, text, str(path))
    exc.checked = True
    return exc


def check_output_path(path: str | os.PathLike, *, folder: bool = False, what: str = "output") -> Path:
    """Refuse, before any work, an output path no writer could use; return it as a ``Path`` (``~`` expanded).

    ``folder``: ``path`` is a folder to write into (else a file to write). Checked in order: a NUL
    character; a name part longer than the file system allows (a file's name keeps room for the
    temporary an atomic write puts beside it, ``temp_name``); a file where the path needs a folder
    (``a/file.txt/out.png``); a folder where a file is wanted, or the reverse; then ``check_writable``
    on the folder the write happens in (a real probe, so root on a read-only or virtual file system
    such as ``/proc`` is refused too).

    Raises:
        NotADirectoryError / IsADirectoryError: a file where a folder is needed, a folder where a file is.
        PermissionError: the folder cannot be written (read-only, not yours).
        OSError: a NUL character (EINVAL), a name too long (ENAMETOOLONG), a folder that takes no new
            files (a virtual file system); every message starts "cannot write" and names the fix.
    """
    text = os.fspath(path)
    if str(text).strip() == "":
        raise _cannot(errno.EINVAL, f"an empty path: give the {what} {'folder' if folder else 'file'} to write",
                      Path("."))
    if "\x00" in str(text):
        raise _cannot(errno.EINVAL, f"cannot write the {what} {text!r}: the path holds a NUL character; give a "
                                    "path without one", Path(str(text).replace("\x00", "")))
    path = Path(text).expanduser()
    parts = [p for p in path.parts if p not in (path.anchor, "", ".", "..")]
    probe = _nearest_existing(path)
    limit = _name_max(probe if probe.is_dir() else probe.parent)
    for i, part in enumerate(parts):
        size = len(os.fsencode(part)) + (TEMP_EXTRA if i == len(parts) - 1 and not folder else 0)
        if size > limit:
            room = limit - (TEMP_EXTRA if i == len(parts) - 1 and not folder else 0)
            raise _cannot(errno.ENAMETOOLONG, f"cannot write the {what}: the name {part[:40]!r}... has "
                                              f"{len(os.fsencode(part))} bytes and this file system takes at most "
                                              f"{room} here; choose a shorter name", path)
    if folder and path.exists() and not path.is_dir():
        raise _cannot(errno.ENOTDIR, f"{text} is a file; give a folder to write into", path, NotADirectoryError)
    if not folder and path.is_dir():
        raise _cannot(errno.EISDIR, f"{text} is a folder; give the file to write", path, IsADirectoryError)
    check_writable(path if folder else path.parent, what)
    return path


def check_writable(folder: str | os.PathLike, what: str = "output") -> None:
    """Refuse early when ``folder`` (or, if it does not exist yet, its nearest existing
    parent) cannot be written: before minutes of work whose result could not be saved.

    The permission bits first (``os.access``), then a real probe: an empty temporary (named with
    ``TMP_MARK``, so ``clean_leftovers`` finds one a kill left) is created and removed in the nearest
    existing folder. The probe catches what the bits cannot: root, to whom ``os.access`` says yes,
    on a read-only mount or a virtual file system (``/proc``, ``/sys``).

    Raises:
        NotADirectoryError: the nearest existing part of the path is a file, not a folder ("X is a
            file, not a folder").
        PermissionError: the folder is read-only or not yours; the message names it and the fix.
        OSError: the folder takes no new files for another reason (a virtual file system, a full
            inode table); the message starts "cannot write" and says to choose another folder.
    """
    folder = Path(folder)
    probe = _nearest_existing(folder)
    if not probe.is_dir():
        raise _cannot(errno.ENOTDIR, f"{probe} is a file, not a folder: the {what} folder {folder} cannot be "
                                     "written; choose another path (or move the file away)", folder, NotADirectoryError)
    read_only = _cannot(errno.EACCES, f"cannot write the {what} folder {folder} ({probe} is read-only or not "
                                      "yours): make it writable (chmod u+w, or a writable copy of the checkout) or "
                                      "choose another folder", folder, PermissionError)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise read_only
    trial = probe / f".probe{TMP_MARK}{secrets.token_hex(4)}"
    try:
        os.close(os.open(trial, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise read_only from None
        raise _cannot(exc.errno or errno.EIO, f"cannot write the {what} folder {folder}: {probe} takes no new "
                                              f"files ({exc.strerror}); choose another folder", folder) from None
    with contextlib.suppress(OSError):
        os.unlink(trial)


def write_problem(exc: BaseException, path: str | os.PathLike | None = None) -> str:
    """One line for a failed write: what happened to which path and the fix."""
    where = path if path is not None else getattr(exc, "filename", None) or "the output"
    code = getattr(exc, "errno", None)
    if isinstance(exc, OSError) and getattr(exc, "checked", False):
        return str(exc.strerror)  # from check_writable / check_output_path: already one line with the fix
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
