# cython: language_level=3, boundscheck=False, wraparound=False
"""Buffers for fragment reads that are not zeroed first, and the event loop's in-memory reads.

``bytearray(n)`` writes n zero bytes before a read overwrites them all: for the 1 MiB a warm
NFS READ moves, that is two passes over memory that is not in the CPU's cache (the fragment
buffers, then the reply), about a sixth of the server's CPU per MiB on the reference machine
(docs/ARCHITECTURE.md "Where the time goes"). ``empty_bytearray`` allocates without them;
every caller overwrites each byte before anyone reads it (a short read is an error, a hole is
zeroed explicitly).

``read_cached`` is preadv2(RWF_NOWAIT) into such a buffer, ``read_cached_into`` into the
caller's buffers (a READ's reply), both holding the GIL: the read only copies from the page
cache (or fails at once), and letting the GIL go around it would hand the event loop's turn
to another thread for up to the switch interval."""

DEF MAX_BUFFERS = 4

from cpython.buffer cimport PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from libc.errno cimport EINTR, errno
from posix.types cimport off_t


cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void *iov_base
        size_t iov_len
    ssize_t preadv2(int fd, const iovec *iov, int iovcnt, off_t offset, int flags)

cdef extern from *:
    """
    #ifndef RWF_NOWAIT
    #define RWF_NOWAIT 0x00000008
    #endif
    """
    int RWF_NOWAIT


def empty_bytearray(Py_ssize_t size):
    """A bytearray of ``size`` bytes whose contents are whatever the allocator left there."""
    if size < 0:
        raise ValueError(f"negative size {size}")
    return PyByteArray_FromStringAndSize(NULL, size)


def read_cached(int fd, long long offset, Py_ssize_t length):
    """The ``length`` bytes at ``offset`` of ``fd`` if the page cache holds all of them, else
    None (not cached, partly cached, or any error: the caller's blocking read reports it)."""
    cdef iovec iov
    cdef ssize_t got
    if length < 0 or offset < 0:
        return None
    buf = PyByteArray_FromStringAndSize(NULL, length)
    if length == 0:
        return buf
    iov.iov_base = PyByteArray_AS_STRING(buf)
    iov.iov_len = <size_t>length
    while True:
        got = preadv2(fd, &iov, 1, <off_t>offset, RWF_NOWAIT)
        if got < 0 and errno == EINTR:
            continue
        break
    if got != length:
        return None
    return buf


def read_cached_into(int fd, long long offset, list buffers):
    """Fill ``buffers`` (writable, at most 4) in order from ``offset`` of ``fd`` if the page
    cache holds every byte: True, else False (their contents are then undefined)."""
    cdef Py_buffer views[MAX_BUFFERS]
    cdef iovec iov[MAX_BUFFERS]
    cdef int count = len(buffers), taken = 0, i
    cdef ssize_t want = 0, got = -1
    if count > MAX_BUFFERS or offset < 0:
        return False
    try:
        for i in range(count):
            PyObject_GetBuffer(buffers[i], &views[i], PyBUF_WRITABLE)
            taken += 1
            iov[i].iov_base = views[i].buf
            iov[i].iov_len = <size_t>views[i].len
            want += views[i].len
        while True:
            got = preadv2(fd, iov, count, <off_t>offset, RWF_NOWAIT)
            if got < 0 and errno == EINTR:
                continue
            break
    finally:
        for i in range(taken):
            PyBuffer_Release(&views[i])
    return got == want
