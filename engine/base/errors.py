"""POSIX errors raised by the engine, each carrying its errno.

Protocol layers map ``FsError.errno`` to their own status codes, so the
engine never needs to know about NFS4ERR_* or HTTP statuses."""

from __future__ import annotations

import errno as _errno
import os


class FsError(OSError):
    """Base class: an error a namespace call reports to its caller."""

    errno_value = _errno.EIO

    def __init__(self, message: str = "", errno_value: int | None = None):
        code = errno_value if errno_value is not None else self.errno_value
        super().__init__(code, message or os.strerror(code))


class NotFound(FsError):
    errno_value = _errno.ENOENT


class Exists(FsError):
    errno_value = _errno.EEXIST


class NotADirectory(FsError):
    errno_value = _errno.ENOTDIR


class IsADirectory(FsError):
    errno_value = _errno.EISDIR


class NotEmpty(FsError):
    errno_value = _errno.ENOTEMPTY


class NameTooLong(FsError):
    errno_value = _errno.ENAMETOOLONG


class InvalidArgument(FsError):
    errno_value = _errno.EINVAL


class AccessDenied(FsError):
    errno_value = _errno.EACCES


class NotPermitted(FsError):
    errno_value = _errno.EPERM


class NoSpace(FsError):
    errno_value = _errno.ENOSPC


class QuotaExceeded(FsError):
    """A hard quota of a directory tree would be passed (EDQUOT: NFS4ERR_DQUOT, NFS3ERR_DQUOT)."""

    errno_value = _errno.EDQUOT


class CrossDevice(FsError):
    errno_value = _errno.EXDEV


class TooManyLinks(FsError):
    errno_value = _errno.EMLINK


class NoData(FsError):
    """Missing extended attribute (ENODATA, what Linux getxattr returns)."""

    errno_value = _errno.ENODATA


class StaleHandle(FsError):
    """An inode number whose generation no longer matches (ESTALE)."""

    errno_value = _errno.ESTALE


class IOFailure(FsError):
    """Data could not be read or written even using redundancy."""

    errno_value = _errno.EIO


class NoRedundancy(IOFailure):
    """A write cannot be placed with its band class's minimum redundancy: too few drives are
    available (missing, failed or degraded), however much space is free. An I/O error (EIO),
    not ENOSPC: freeing space does not help, bringing the drives back does."""


class WritesNotRecorded(IOFailure):
    """Buffered writes whose stripes reached the drives but whose catalog commit failed because
    the catalog was unreachable (a PostgreSQL failover): they are let go. A local caller gets
    EIO; NFS answers DELAY / JUKEBOX and its write verifier changes (``DataPath.writes_lost``),
    so its clients send those UNSTABLE writes again."""


class ReadOnly(FsError):
    errno_value = _errno.EROFS


class NoSuchOffset(FsError):
    """SEEK_DATA past the last data, SEEK_HOLE past the end (ENXIO, what lseek returns)."""

    errno_value = _errno.ENXIO


class ConfigError(Exception):
    """A configuration value is wrong: names the key, the value and what is expected."""

    def __init__(self, key: str, value: object, expected: str):
        self.key, self.value, self.expected = key, value, expected
        super().__init__(f"config error: {key} = {value!r}: expected {expected}")


class JobAbandoned(Exception):
    """A job someone waits for will not finish: the daemon running it (or meant to) is gone."""
