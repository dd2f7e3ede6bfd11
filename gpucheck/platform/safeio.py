"""Safe file writing and reading: the one place where gpucheck opens a file a user named or a
file in its state or reference directory.

Writing a user-named output (`--output`, `--prom`, `--report`, `telemetry dump -o`):
- a regular file (or a name that does not exist yet) is written atomically: a temporary file in
  the same folder (O_EXCL, never following a symlink), fsync, rename over the name, fsync of the
  folder. An existing file keeps its permission bits (setuid/setgid/sticky dropped); a new one is
  0644. Nothing half-written is ever left at the name.
- a FIFO, /dev/null (character device 1:3) and a terminal are written through (opened without
  following a symlink, O_NONBLOCK, never replaced; WRITE_THROUGH_TIMEOUT_S at most, so a FIFO
  nobody reads cannot hang gpucheck). Every other kind of file (a directory, another device, a
  socket) is refused, and never replaced.
- a symlink (at the name, or a folder on the way) is followed only when an ordinary user could
  not have planted it: it is owned by root or by the caller, and the folder that holds it is owned
  by root or by the caller and not writable by group or others (or sticky, like /tmp, where only
  a link's owner can replace it). Anything else is refused. The path is walked one component at
  a time with openat(O_NOFOLLOW), so nothing can be swapped in between the check and the use.
- never in the kernel's and the devices' file systems (`/proc`, `/sys`, `/dev` but `/dev/shm`,
  and any folder on a PSEUDO_FILESYSTEMS mount): a "file" there is a kernel setting or a device,
  and even root's write to it is no output (`-o /proc/version` ran every check, then warned).

State and reference files (history, cursors, the repro reference file and its lock): opened with
O_NOFOLLOW and O_NONBLOCK and used only when fstat says they are regular files; replaced
atomically as above (never a write through anything). As root, their folder must be owned by root
and not writable by group or others, and every folder on the way to it must be owned by root and
not writable by group or others unless sticky (/tmp): `check_private_dir` (RefusedPath otherwise).

Reading an input file (snapshot, config, reference, `hang --from`/`--groups`): regular files only (a FIFO or
/dev/zero would hang), opened with O_NONBLOCK, at most a size limit per kind of file (LIMITS);
JSON documents nested deeper than MAX_JSON_DEPTH are refused (a deep one used to raise
RecursionError).

Refusals are RefusedPath, an OSError (so the existing `except OSError` paths handle it) whose
str() is "PATH: reason".
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import select
import stat
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

TMP_PREFIX = ".gpucheck-tmp-"  # every temporary file gpucheck creates starts with this
STALE_TMP_AGE_S = 3600.0  # a temporary file of ours older than this was left by a killed writer
WRITE_THROUGH_TIMEOUT_S = 10.0
MAX_LINK_HOPS = 16
MAX_JSON_DEPTH = 64
NEW_OUTPUT_MODE = 0o644

MiB = 1 << 20
# The largest input gpucheck reads, per kind of file (bytes).
LIMITS: dict[str, int] = {
    "config": 1 * MiB,
    "snapshot": 64 * MiB,
    "reference": 16 * MiB,
    "cursor": 1 * MiB,
    "report input": 1024 * MiB,  # `gpucheck report`: a sweep report of thousands of nodes' verdicts
    "hang": 1024 * MiB,  # `hang --from`: a recording of thousands of nodes' stacks
    "groups": 64 * MiB,  # `hang --groups`: the parallel groups of a job's ranks
}

_PATH_FLAG = getattr(os, "O_PATH", os.O_RDONLY)
_DIR_FLAGS = _PATH_FLAG | os.O_DIRECTORY | os.O_CLOEXEC
_NULL_DEVICE = (1, 3)

# File systems whose files are the kernel's or the devices', never an output (by the mount's type
# in /proc/self/mountinfo), and the folders that hold them wherever the mount's type is another.
PSEUDO_FILESYSTEMS = frozenset({
    "proc", "sysfs", "devtmpfs", "devpts", "debugfs", "tracefs", "securityfs", "cgroup", "cgroup2",
    "configfs", "pstore", "bpf", "efivarfs", "fusectl", "mqueue", "binfmt_misc", "selinuxfs", "autofs",
    "hugetlbfs", "rpc_pipefs", "nsfs"})
_KERNEL_FOLDERS = ("/proc", "/sys", "/dev")
_WRITABLE_UNDER_DEV = ("/dev/shm",)


class RefusedPath(OSError):
    """A path gpucheck will not use, with the reason (one line)."""

    def __init__(self, path: str, reason: str, err: int = errno.EINVAL):
        super().__init__(err, reason, path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def describe_error(e: BaseException, path: str | None = None) -> str:
    """One line for an OSError (or anything else) about `path`: the reason, with the file it is
    about when that is not `path` itself."""
    if isinstance(e, OSError):
        reason = e.strerror or str(e)
        if e.errno == errno.ENAMETOOLONG:
            reason = "file name too long"
        elif e.errno == errno.ENXIO and not isinstance(e, RefusedPath):
            reason = f"no process opened it for reading within {WRITE_THROUGH_TIMEOUT_S:g} s"
        where = e.filename if isinstance(e.filename, str) else None
        if where and path and os.path.normpath(where) != os.path.normpath(path):
            return f"{where}: {reason}"
        return reason
    return f"{type(e).__name__}: {e}"


def output_problem(e: BaseException, path: str) -> str:
    """describe_error for an output path, naming a folder on the way that does not exist."""
    if isinstance(e, OSError) and e.filename and os.path.normpath(str(e.filename)) != os.path.normpath(path):
        if isinstance(e, FileNotFoundError):
            return f"folder {e.filename} does not exist"
        if e.errno == errno.ENOTDIR:
            return f"folder {e.filename} does not exist ({describe_error(e)})"
    return describe_error(e, path)


def _kind(st: os.stat_result) -> str:
    m = st.st_mode
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symlink"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(m):
            return name
    return "not a regular file"


def _is_terminal(rdev: int) -> bool:
    major, minor = os.major(rdev), os.minor(rdev)
    # 4: virtual consoles and serial lines, 5:0 /dev/tty, 5:1 the console, 136-143: pseudo-terminals
    return major == 4 or (major == 5 and minor in (0, 1)) or 136 <= major <= 143


def _writable_device(st: os.stat_result) -> bool:
    if not stat.S_ISCHR(st.st_mode):
        return False
    return (os.major(st.st_rdev), os.minor(st.st_rdev)) == _NULL_DEVICE or _is_terminal(st.st_rdev)


def _others_can_replace(st: os.stat_result) -> bool:
    """Whether users other than the owner may rename or remove entries of this folder."""
    mode = stat.S_IMODE(st.st_mode)
    return bool(mode & 0o022) and not mode & stat.S_ISVTX


# -- walking a path ------------------------------------------------------------------------------

def _trusted_link(dfd: int, name: str, st: os.stat_result, folder: str) -> str:
    """The target of symlink `name` in folder `dfd`, when an ordinary user cannot have planted it."""
    me = os.geteuid()
    where = os.path.join(folder, name)
    owners = "root" if me == 0 else f"root or uid {me}"
    if st.st_uid not in (0, me):
        raise RefusedPath(where, f"a symlink owned by uid {st.st_uid}: not followed (only links "
                                 f"owned by {owners} are)", errno.ELOOP)
    d = os.fstat(dfd)
    if d.st_uid not in (0, me) or _others_can_replace(d):
        raise RefusedPath(where, f"a symlink in a folder others can change ({folder}: owner uid "
                                 f"{d.st_uid}, mode {stat.S_IMODE(d.st_mode):04o}): not followed",
                          errno.ELOOP)
    return os.readlink(name, dir_fd=dfd)


def _swap(old: int, new: int) -> int:
    os.close(old)
    return new


Policy = Callable[[int, str, bool], None]


def root_private_policy(fd: int, folder: str, final: bool) -> None:
    """As root: the state/reference folder and every folder on the way to it are owned by root;
    the folder itself is not writable by group or others, a folder on the way only when sticky."""
    st = os.fstat(fd)
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != 0:
        raise RefusedPath(folder, f"owned by uid {st.st_uid}, not root: its owner could plant "
                                  "symlinks or files that root would then use")
    if final and mode & 0o022:
        raise RefusedPath(folder, f"writable by group or others (mode {mode:04o}): refused as root")
    if not final and _others_can_replace(st):
        raise RefusedPath(folder, f"a folder on the way that others can write (mode {mode:04o}, "
                                  "not sticky): refused as root")


def open_folder(path: str, *, policy: Policy | None = None, create_mode: int | None = None,
                missing_ok: bool = False) -> tuple[int, str]:
    """(an O_PATH descriptor of folder `path`, its real path), walking one component at a time:
    symlinks followed only when trusted (see the module), every folder passed to `policy(fd,
    real, final)`. Missing folders are created with `create_mode` (chmod'ed: umask plays no
    part) when given; else, with `missing_ok`, the deepest existing folder is returned; else
    FileNotFoundError naming the missing folder."""
    if not path.startswith("/"):  # from the root, so that the folders above the cwd are checked too
        path = os.path.join(os.getcwd(), path)
    real = "/"
    fd = os.open("/", _DIR_FLAGS)
    todo = [p for p in reversed(path.split("/")) if p not in ("", ".")]  # a stack: next is last
    hops = 0
    try:
        if policy:
            policy(fd, real, not todo)
        while todo:
            name = todo.pop()
            try:
                (new_fd, real), hops = _step(fd, real, name, todo, hops, policy, create_mode, missing_ok)
                fd = _swap(fd, new_fd)
            except _Stop:
                return fd, real
            except RefusedPath:
                raise
            except OSError as e:  # name the whole path, not just the component
                if e.filename in (None, name):
                    raise type(e)(e.errno, e.strerror, os.path.join(real, name)) from None
                raise
        return fd, real
    except BaseException:
        os.close(fd)
        raise


class _Stop(Exception):
    """open_folder(missing_ok=True) reached a folder that does not exist: stop there."""


def _step(fd: int, real: str, name: str, todo: list[str], hops: int, policy: Policy | None,
          create_mode: int | None, missing_ok: bool) -> tuple[tuple[int, str], int]:
    """One component of open_folder's walk from folder `fd`: (the next folder's descriptor, its
    real path, links followed so far); a symlink pushes its target's components onto `todo`.
    Never closes `fd`; closes what it opened when it fails."""
    if name == "..":
        return _enter(os.open("..", _DIR_FLAGS, dir_fd=fd), os.path.dirname(real) or "/", policy, todo), hops
    where = os.path.join(real, name)
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        if create_mode is None and missing_ok:
            raise _Stop from None
        if create_mode is None:
            raise FileNotFoundError(errno.ENOENT, "no such folder", where) from None
        try:
            os.mkdir(name, create_mode, dir_fd=fd)
            os.chmod(name, create_mode, dir_fd=fd)
        except FileExistsError:  # made by someone else meanwhile: judged like any other below
            pass
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        if hops >= MAX_LINK_HOPS:
            raise RefusedPath(where, "too many levels of symbolic links", errno.ELOOP)
        target = _trusted_link(fd, name, st, real)
        todo.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
        if target.startswith("/"):
            return (os.open("/", _DIR_FLAGS), "/"), hops + 1
        return (os.dup(fd), real), hops + 1
    if not stat.S_ISDIR(st.st_mode):
        raise RefusedPath(where, f"not a folder (it is {_kind(st)})", errno.ENOTDIR)
    return _enter(os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd), where, policy, todo), hops


def _enter(fd: int, real: str, policy: Policy | None, todo: list[str]) -> tuple[int, str]:
    """(fd, real) once `policy` accepts the folder; fd closed when it does not."""
    if policy:
        try:
            policy(fd, real, not todo)
        except BaseException:
            os.close(fd)
            raise
    return fd, real


def private_policy() -> Policy | None:
    return root_private_policy if os.geteuid() == 0 else None


def check_private_dir(path: str | os.PathLike[str], *, create: bool = False, missing_ok: bool = False) -> str:
    """The real path of a state/reference folder, after the checks of the module (as root: owned
    by root, not writable by others, nor any folder on the way). `create`: make missing folders
    0700; `missing_ok`: check only the part that exists (what is missing will be created by a
    checked walk). RefusedPath / FileNotFoundError / OSError otherwise."""
    fd, real = open_folder(os.fspath(path), policy=private_policy(), create_mode=0o700 if create else None,
                           missing_ok=missing_ok)
    os.close(fd)
    return real


# -- writing -------------------------------------------------------------------------------------

def write_all(fd: int, data: bytes, deadline: float | None = None) -> None:
    """Write every byte of `data`. A short write continues; 0 bytes written is ENOSPC; with a
    deadline, a descriptor that cannot take more (EAGAIN) is polled until then."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except BlockingIOError:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(errno.ETIMEDOUT, f"nobody read it within {WRITE_THROUGH_TIMEOUT_S:g} s")
            p = select.poll()
            p.register(fd, select.POLLOUT)
            p.poll(None if left is None else max(1, int(left * 1000)))
            continue
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def _tmp_name() -> str:
    return f"{TMP_PREFIX}{secrets.token_hex(8)}.tmp"


def clean_stale_tmps(dfd: int, *, age_s: float = STALE_TMP_AGE_S, now: float | None = None) -> int:
    """Remove our own temporary files (TMP_PREFIX, regular, owned by us) older than `age_s` from
    folder `dfd`; never follows a symlink. The number removed."""
    now = time.time() if now is None else now
    me = os.geteuid()
    removed = 0
    try:
        rfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return 0
    try:
        with os.scandir(rfd) as it:
            for entry in it:
                if not (entry.name.startswith(TMP_PREFIX) and entry.name.endswith(".tmp")):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and st.st_uid == me and now - st.st_mtime > age_s:
                        os.unlink(entry.name, dir_fd=dfd)
                        removed += 1
                except OSError:
                    continue
    finally:
        os.close(rfd)
    return removed


def _fsync_folder(dfd: int) -> None:
    try:
        rfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return
    try:
        os.fsync(rfd)
    except OSError:
        pass
    finally:
        os.close(rfd)


def _byte_chunks(data: "bytes | str | Iterable[bytes | str]") -> Iterator[bytes]:
    """`data` as bytes chunks: a whole text or bytes, or an iterable of them (a streamed report)."""
    if isinstance(data, (bytes, bytearray, str)):
        data = (data,)
    for chunk in data:
        yield chunk.encode("utf-8") if isinstance(chunk, str) else bytes(chunk)


def replace_in(dfd: int, folder: str, name: str, data: "bytes | str | Iterable[bytes | str]", mode: int) -> None:
    """Atomically replace `name` in folder `dfd` with `data` (bytes, text, or an iterable of
    chunks written in turn; permission bits `mode`): a temporary file, fsync, a check that the
    name is still missing or a regular file, rename."""
    tmp = _tmp_name()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        try:
            os.fchmod(fd, mode & 0o777)
            for chunk in _byte_chunks(data):
                write_all(fd, chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(st.st_mode):
                raise RefusedPath(os.path.join(folder, name), f"is now {_kind(st)}: not replaced")
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        raise
    _fsync_folder(dfd)
    clean_stale_tmps(dfd)


@dataclass
class _Target:
    dfd: int
    folder: str
    name: str
    kind: str  # new | regular | through
    mode: int | None = None
    magic: bool = False  # a /proc/<pid>/fd link to a pipe or a terminal: opened through the link

    @property
    def path(self) -> str:
        return os.path.join(self.folder, self.name)


def _plan_output(path: str) -> _Target:
    """What writing `path` means (the caller closes .dfd). RefusedPath / OSError otherwise."""
    cur = path
    for _ in range(MAX_LINK_HOPS):
        folder, name = os.path.split(cur)
        if name in ("", ".", ".."):
            raise RefusedPath(path, "names a folder, not a file", errno.EISDIR)
        dfd, real = open_folder(folder or ".")
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            _refuse_or_close(path, dfd, real)
            return _Target(dfd, real, name, "new")
        except BaseException:
            os.close(dfd)
            raise
        if stat.S_ISREG(st.st_mode):
            _refuse_or_close(path, dfd, real)
            return _Target(dfd, real, name, "regular", stat.S_IMODE(st.st_mode) & 0o777)
        if stat.S_ISFIFO(st.st_mode) or _writable_device(st):
            return _Target(dfd, real, name, "through")
        try:
            if not stat.S_ISLNK(st.st_mode):
                raise RefusedPath(os.path.join(real, name), f"is {_kind(st)}: gpucheck writes only regular "
                                  "files (by rename), a FIFO, /dev/null or a terminal, and never replaces it")
            target = _trusted_link(dfd, name, st, real)
        except BaseException:
            os.close(dfd)
            raise
        if "/" not in target and ":[" in target:  # e.g. /dev/stdout -> /proc/self/fd/1 -> pipe:[123]
            return _Target(dfd, real, name, "through", magic=True)
        os.close(dfd)
        cur = os.path.join(real, target)
    raise RefusedPath(path, "too many levels of symbolic links", errno.ELOOP)


def _refuse_or_close(path: str, dfd: int, folder: str) -> None:
    try:
        _refuse_kernel_folder(path, dfd, folder)
    except BaseException:
        os.close(dfd)
        raise


def check_output(path: str) -> None:
    """Raise RefusedPath/OSError when `path` could not be written as an output (see the module);
    a missing or not writable folder included, and a kernel or device file system. Nothing is
    created."""
    t = _plan_output(path)
    try:
        if t.kind != "through" and not os.access(t.folder, os.W_OK | os.X_OK):
            raise RefusedPath(path, f"folder {t.folder} is not writable", errno.EACCES)
    finally:
        os.close(t.dfd)


def _refuse_kernel_folder(path: str, dfd: int, folder: str) -> None:
    """RefusedPath when `folder` (open as `dfd`) is the kernel's or the devices': under /proc,
    /sys or /dev (but /dev/shm), or on a PSEUDO_FILESYSTEMS mount."""
    under = [top for top in _KERNEL_FOLDERS if folder == top or folder.startswith(top + "/")]
    if under and not any(folder == ok or folder.startswith(ok + "/") for ok in _WRITABLE_UNDER_DEV):
        raise RefusedPath(path, f"is in {under[0]}, the kernel's or the devices' files: never an output",
                          errno.EPERM)
    fs_type = _mount_type(os.fstat(dfd).st_dev)
    if fs_type in PSEUDO_FILESYSTEMS:
        raise RefusedPath(path, f"is on a {fs_type} file system, the kernel's or the devices' files: never an output",
                          errno.EPERM)


def _mount_type(device: int) -> str | None:
    """The type of the file system mounted from `device` (/proc/self/mountinfo), None where it
    cannot be told."""
    wanted = f"{os.major(device)}:{os.minor(device)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == wanted and "-" in fields:
                    after = fields[fields.index("-") + 1:]
                    return after[0] if after else None
    except OSError:
        pass
    return None


def _write_through(t: _Target, data: "bytes | str | Iterable[bytes | str]") -> None:
    """Write into a FIFO, /dev/null or a terminal; a FIFO without a reader yet is given until
    WRITE_THROUGH_TIMEOUT_S to get one (and to read everything)."""
    deadline = time.monotonic() + WRITE_THROUGH_TIMEOUT_S
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    while True:
        try:
            fd = os.open(t.name, flags if t.magic else flags | os.O_NOFOLLOW, dir_fd=t.dfd)
            break
        except OSError as e:
            if e.errno != errno.ENXIO or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
    try:
        st = os.fstat(fd)
        if not (stat.S_ISFIFO(st.st_mode) or _writable_device(st)):
            raise RefusedPath(t.path, f"is {_kind(st)}: not written through")
        for chunk in _byte_chunks(data):
            write_all(fd, chunk, deadline=deadline)
    finally:
        os.close(fd)


def write_output(path: str | os.PathLike[str], data: "bytes | str | Iterable[bytes | str]") -> None:
    """Write a user-named output (see the module): bytes, text, or an iterable of chunks (a
    report streamed from disk). RefusedPath / OSError when it cannot be."""
    t = _plan_output(os.fspath(path))
    try:
        if t.kind == "through":
            _write_through(t, data)
        else:
            replace_in(t.dfd, t.folder, t.name, data, NEW_OUTPUT_MODE if t.mode is None else t.mode)
    finally:
        os.close(t.dfd)


def replace_private(path: str | os.PathLike[str], data: bytes | str, *, new_mode: int = 0o600,
                    create_folder: bool = False) -> None:
    """Atomically replace a state/reference file: its folder checked (check_private_dir), the
    name missing or a regular file (a symlink there is refused, never followed), its mode kept."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    folder, name = os.path.split(os.fspath(path))
    dfd, real = open_folder(folder or ".", policy=private_policy(), create_mode=0o700 if create_folder else None)
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            mode = new_mode
        else:
            if not stat.S_ISREG(st.st_mode):
                raise RefusedPath(os.path.join(real, name), f"is {_kind(st)}, not a regular file: refused")
            mode = stat.S_IMODE(st.st_mode) & 0o777
        replace_in(dfd, real, name, data, mode)
    finally:
        os.close(dfd)


# -- reading -------------------------------------------------------------------------------------

def _read_limited(fd: int, path: str, limit: int, kind: str) -> bytes:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise RefusedPath(path, f"not a regular file (it is {_kind(st)})")
    too_big = f"too big: more than {limit} bytes (the limit for a {kind} file)"
    if st.st_size > limit:
        raise RefusedPath(path, too_big, errno.EFBIG)
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(1 << 20, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise RefusedPath(path, too_big, errno.EFBIG)


def _keep_if_regular(fd: int, p: str) -> int:
    """`fd` when it is open on a regular file; closed, and RefusedPath, when it is not."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise RefusedPath(p, f"not a regular file (it is {_kind(st)})")
    return fd


def _read_all(fd: int, path: str | os.PathLike[str], kind: str) -> bytes:
    """The bytes of the file open on `fd` (closed after), within the LIMITS of `kind`."""
    try:
        return _read_limited(fd, os.fspath(path), LIMITS[kind], kind)
    finally:
        os.close(fd)


def open_input(path: str | os.PathLike[str]) -> int:
    """A read descriptor of a user-named input file: a regular file (symlinks followed: the user
    named it), opened O_NONBLOCK so that a FIFO swapped in cannot hang; RefusedPath otherwise."""
    p = os.fspath(path)
    st = os.stat(p)
    if not stat.S_ISREG(st.st_mode):
        raise RefusedPath(p, f"not a regular file (it is {_kind(st)})")
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    return _keep_if_regular(fd, p)


def read_input(path: str | os.PathLike[str], kind: str) -> bytes:
    """The bytes of a user-named input file of `kind` (a key of LIMITS)."""
    return _read_all(open_input(path), path, kind)


def open_private(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """A descriptor of a state/reference file: never through a symlink (O_NOFOLLOW), O_NONBLOCK,
    and only a regular file (RefusedPath otherwise). With O_CREAT a new file gets exactly `mode`."""
    p = os.fspath(path)
    base = flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = -1
    try:
        if flags & os.O_CREAT:
            try:
                fd = os.open(p, base | os.O_EXCL, mode)
                os.fchmod(fd, mode)
            except FileExistsError:
                fd = -1
        if fd < 0:
            fd = os.open(p, base & ~os.O_CREAT)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RefusedPath(p, "is a symlink: state and reference files are never followed", errno.ELOOP) from None
        raise
    return _keep_if_regular(fd, p)


def read_private(path: str | os.PathLike[str], kind: str) -> bytes:
    """The bytes of a state/reference file of `kind` (open_private, LIMITS)."""
    return _read_all(open_private(path), path, kind)


def loads_json(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, with nesting deeper than `max_depth` a ValueError (never a RecursionError)."""
    try:
        doc = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    # Level by level (json.loads makes plain dicts and lists only): ten times faster than a stack
    # of (node, depth) pairs on a sweep report of a thousand verdicts.
    level = [doc] if type(doc) in (dict, list) else []
    depth = 1
    while level:
        if depth > max_depth:
            raise ValueError(f"nested deeper than {max_depth} levels")
        below = []
        for node in level:
            for child in (node.values() if type(node) is dict else node):
                kind = type(child)
                if kind is dict or kind is list:
                    below.append(child)
        level = below
        depth += 1
    return doc
