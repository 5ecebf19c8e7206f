# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The drives' writer threads in C: appends and fdatasync without the GIL.

Each ``DriveQueue`` owns one POSIX thread: it takes everything queued for its drive at once,
writes the appends in order (pwrite, starting their writeback with sync_file_range), makes them
durable with one fdatasync per zone file, and only then counts each append's ``Ticket`` down;
whatever is queued meanwhile is the next batch, which the next fdatasync covers (group commit).
A batch of one append is written durably in one pwritev2(RWF_DSYNC). The thread takes the GIL
only where Python must run: when a ticket reaches zero (its ``all_written()``), when an append
or fdatasync failed (the ``on_error`` callback first, then the count), and for ``call(fn)``
items, which run in queue order after every append queued before them is durable (so nothing
queued later overtakes them). Buffers and tickets of finished appends are released by the next
caller that holds the GIL anyway (the next ``append``, a GIL section of the thread, ``stop``),
so a batch that completes no ticket costs no GIL at all.

Why: in the pure-Python writers each fragment took a drive thread and its syncer through the
GIL four to six times (queue wake-up, the append's return, the fsync's return, the ticket's
lock and event); with ten drives and eight NFS writers that contention, not the CPUs, bounded
the data path (docs/performance.md). A second thread per drive that synced while the writer
wrote the next batch overlapped only the page-cache copy, and cost a wake-up and a thread
switch per batch ("The compiled drive writers" in docs/datapath.md has the figures)."""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.errno cimport EINTR, EINVAL, ENOSYS, EOPNOTSUPP, errno
from libc.stdint cimport int64_t, uint64_t
from libc.stdlib cimport calloc, free
from posix.types cimport off_t
from posix.unistd cimport fdatasync, pwrite


cdef extern from "<fcntl.h>" nogil:
    int sync_file_range(int fd, off_t offset, off_t nbytes, unsigned int flags)
    unsigned int SYNC_FILE_RANGE_WRITE

cdef extern from "<sys/uio.h>" nogil:
    struct iovec:
        void *iov_base
        size_t iov_len
    ssize_t pwritev2(int fd, const iovec *iov, int iovcnt, off_t offset, int flags)

cdef extern from *:
    """
    #ifndef RWF_DSYNC
    #define RWF_DSYNC 0x00000002
    #endif
    """
    int RWF_DSYNC

cdef extern from "Python.h":
    ctypedef int PyGILState_STATE
    ctypedef struct PyThreadState:
        pass
    PyGILState_STATE PyGILState_Ensure() nogil
    void PyGILState_Release(PyGILState_STATE) nogil
    PyThreadState *PyEval_SaveThread() nogil
    void PyEval_RestoreThread(PyThreadState *) nogil

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    int clock_gettime(int clk, timespec *ts)
    int CLOCK_MONOTONIC

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *m, void *attr)
    int pthread_mutex_destroy(pthread_mutex_t *m)
    int pthread_mutex_lock(pthread_mutex_t *m)
    int pthread_mutex_unlock(pthread_mutex_t *m)
    int pthread_cond_init(pthread_cond_t *c, void *attr)
    int pthread_cond_destroy(pthread_cond_t *c)
    int pthread_cond_wait(pthread_cond_t *c, pthread_mutex_t *m)
    int pthread_cond_signal(pthread_cond_t *c)
    int pthread_create(pthread_t *t, void *attr, void *(*fn)(void *) noexcept nogil, void *arg)
    int pthread_join(pthread_t t, void **ret)


cdef enum:
    OP_APPEND = 1
    OP_CALL = 2
    OP_STOP = 3


cdef struct TicketState:
    pthread_mutex_t lock
    int64_t remaining


cdef struct Op:
    int kind
    int fd
    int zone_idx
    int err            # errno of a failed write or fdatasync, 0 if durable
    int failed_sync    # the error came from fdatasync, not from the write
    int zero           # this append brought its ticket to zero
    off_t offset
    const char *buf   # APPEND: the bytes, valid while ``owner`` lives and the ticket is open
    size_t length
    PyObject *owner    # APPEND: the object the bytes belong to (a reference)
    const char *head   # APPEND of two parts: bytes written before ``buf`` (else NULL)
    size_t head_len
    PyObject *head_owner
    PyObject *ticket   # APPEND: the Ticket (a reference), CALL: the callable
    TicketState *tstate
    Op *next


cdef struct QueueState:
    pthread_mutex_t lock
    pthread_cond_t cond        # the writer waits here for work
    Op *head
    Op *tail
    Op *garbage        # finished ops whose buffer and ticket wait for the GIL
    PyObject *on_error
    # counters (read with the lock held)
    uint64_t appends
    uint64_t bytes
    uint64_t syncs
    uint64_t batches
    uint64_t sync_ns
    uint64_t write_ns


cdef inline uint64_t now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <uint64_t>ts.tv_sec * 1000000000 + <uint64_t>ts.tv_nsec


cdef class Ticket:
    """A count of appends on their way to durable media; ``all_written()`` (defined by the
    subclass) runs once, in whichever thread brings the count to zero."""

    cdef TicketState *st

    def __cinit__(self, *args, **kwargs):
        self.st = <TicketState *>calloc(1, sizeof(TicketState))
        if self.st == NULL:
            raise MemoryError()
        pthread_mutex_init(&self.st.lock, NULL)

    def __dealloc__(self):
        if self.st != NULL:
            pthread_mutex_destroy(&self.st.lock)
            free(self.st)
            self.st = NULL

    @property
    def remaining(self):
        with nogil:
            pthread_mutex_lock(&self.st.lock)
        value = self.st.remaining
        pthread_mutex_unlock(&self.st.lock)
        return value

    @remaining.setter
    def remaining(self, int64_t value):
        with nogil:
            pthread_mutex_lock(&self.st.lock)
        self.st.remaining = value
        pthread_mutex_unlock(&self.st.lock)

    def fragment_done(self, int64_t count=1):
        """``count`` appends are durable (or failed: see ``error``), or will never be queued."""
        if arrive(self.st, count):
            self.all_written()

    def all_written(self):
        pass


cdef inline bint arrive(TicketState *st, int64_t count) noexcept nogil:
    cdef bint last
    pthread_mutex_lock(&st.lock)
    st.remaining -= count
    last = st.remaining == 0
    pthread_mutex_unlock(&st.lock)
    return last


cdef void release_ops(Op *op):
    """With the GIL: give back the buffers and references of a chain of finished ops."""
    cdef Op *nxt
    while op != NULL:
        nxt = op.next
        if op.owner != NULL:
            Py_DECREF(<object>op.owner)
        if op.head_owner != NULL:
            Py_DECREF(<object>op.head_owner)
        if op.ticket != NULL:
            Py_DECREF(<object>op.ticket)
        free(op)
        op = nxt


cdef int write_all(int fd, const char *buf, size_t length, off_t offset) noexcept nogil:
    """pwrite until done; 0 or the errno."""
    cdef ssize_t n
    cdef size_t done = 0
    while done < length:
        n = pwrite(fd, buf + done, length - done, offset + <off_t>done)
        if n < 0:
            if errno == EINTR:
                continue
            return errno
        if n == 0:
            return EINVAL
        done += <size_t>n
    return 0


cdef int write_rest(Op *op, ssize_t done) noexcept nogil:
    """pwrite what is left of the append after its first ``done`` bytes; 0 or the errno."""
    cdef int err
    if <size_t>done < op.head_len:
        err = write_all(op.fd, op.head + done, op.head_len - <size_t>done, op.offset + done)
        if err:
            return err
        done = <ssize_t>op.head_len
    done -= <ssize_t>op.head_len
    return write_all(
        op.fd,
        op.buf + done,
        op.length - <size_t>done,
        op.offset + <off_t>op.head_len + done,
    )


cdef ssize_t write_vector(Op *op, int flags) noexcept nogil:
    """One pwritev2 of the append's parts (header and payload, or the one buffer)."""
    cdef iovec iov[2]
    cdef int count = 0
    cdef ssize_t n
    if op.head_len:
        iov[0].iov_base = <void *>op.head
        iov[0].iov_len = op.head_len
        count = 1
    iov[count].iov_base = <void *>op.buf
    iov[count].iov_len = op.length
    count += 1
    while True:
        n = pwritev2(op.fd, iov, count, op.offset, flags)
        if n < 0 and errno == EINTR:
            continue
        return n


cdef int write_op(Op *op) noexcept nogil:
    """pwrite the whole append (both parts in one call where there are two); 0 or the errno."""
    if op.head_len == 0:
        return write_all(op.fd, op.buf, op.length, op.offset)
    cdef ssize_t n = write_vector(op, 0)
    if n < 0:
        return errno
    return write_rest(op, n)


cdef int write_durable(Op *op) noexcept nogil:
    """One append made durable in one system call where the kernel allows it."""
    cdef ssize_t n = write_vector(op, RWF_DSYNC)
    if n == <ssize_t>(op.head_len + op.length):
        return 0
    if n < 0 and errno not in (EINVAL, ENOSYS, EOPNOTSUPP):
        return errno
    if n < 0:
        n = 0
    # a short write or no RWF_DSYNC: finish with plain writes and one fdatasync
    cdef int err = write_rest(op, n)
    if err:
        return err
    while fdatasync(op.fd) != 0:
        if errno != EINTR:
            return errno
    return 0


cdef void write_run(QueueState *q, Op *first, Op *stop_at) noexcept nogil:
    """pwrite the appends first .. stop_at (exclusive), in order; errors stay in each op."""
    cdef Op *op = first
    cdef uint64_t t0 = now_ns()
    while op != stop_at:
        op.err = write_op(op)
        if op.err == 0:
            # start writing it out now: the device works on it while the next appends are written
            sync_file_range(
                op.fd, op.offset, <off_t>(op.head_len + op.length), SYNC_FILE_RANGE_WRITE
            )
        q.appends += 1
        q.bytes += <uint64_t>(op.head_len + op.length)
        op = op.next
    q.write_ns += now_ns() - t0


cdef void sync_run(QueueState *q, Op *first, Op *stop_at) noexcept nogil:
    """One fdatasync per zone file the written appends first .. stop_at touched; a failed
    fdatasync fails every append of that file in the run."""
    cdef Op *op
    cdef Op *other
    cdef int err
    cdef bint seen
    cdef uint64_t t0 = now_ns()
    op = first
    while op != stop_at:
        if op.err == 0:
            seen = False
            other = first
            while other != op:
                if other.fd == op.fd and other.err == 0:
                    seen = True
                    break
                other = other.next
            if not seen:
                err = 0
                while fdatasync(op.fd) != 0:
                    if errno != EINTR:
                        err = errno
                        break
                q.syncs += 1
                if err:
                    other = op
                    while other != stop_at:
                        if other.fd == op.fd and other.err == 0:
                            other.err = err
                            other.failed_sync = 1
                        other = other.next
        op = op.next
    q.sync_ns += now_ns() - t0


cdef void to_garbage(QueueState *q, Op *first, Op *last) noexcept nogil:
    pthread_mutex_lock(&q.lock)
    last.next = q.garbage
    q.garbage = first
    pthread_mutex_unlock(&q.lock)


cdef void complete_appends(QueueState *q, Op *first, Op *stop_at) noexcept nogil:
    """Count the appends down; take the GIL only if a ticket completed or an append failed."""
    cdef Op *op = first
    cdef bint need_gil = False
    while op != stop_at:
        if op.err:
            need_gil = True
        elif arrive(op.tstate, 1):
            op.zero = 1
            need_gil = True
        op = op.next
    if need_gil:
        finish_with_gil(q, first, stop_at)


cdef void finish_with_gil(QueueState *q, Op *first, Op *stop_at) noexcept with gil:
    cdef Op *op = first
    cdef object ticket
    while op != stop_at:
        ticket = <object>op.ticket
        try:
            if op.err:
                (<object>q.on_error)(
                    ticket, op.zone_idx, op.err, "fsync" if op.failed_sync else "write"
                )
                if arrive(op.tstate, 1):
                    ticket.all_written()
            elif op.zero:
                ticket.all_written()
        except BaseException:
            import traceback
            traceback.print_exc()  # a bug in a callback must not stop the drive's thread
        op = op.next


cdef void run_call(Op *op) noexcept with gil:
    try:
        (<object>op.ticket)()
    except BaseException:
        import traceback
        traceback.print_exc()  # the callables handle their own errors; this is a bug


cdef void *writer_main(void *arg) noexcept nogil:
    """Write each batch of appends in queue order and make it durable before taking the next
    (a batch of one append in one pwritev2 with RWF_DSYNC); run calls in their place."""
    cdef QueueState *q = <QueueState *>arg
    cdef Op *batch
    cdef Op *op
    cdef Op *run_start
    cdef Op *last
    cdef bint stopping = False
    cdef PyGILState_STATE gstate = PyGILState_Ensure()
    cdef PyThreadState *tstate = PyEval_SaveThread()
    while not stopping:
        pthread_mutex_lock(&q.lock)
        while q.head == NULL:
            pthread_cond_wait(&q.cond, &q.lock)
        batch = q.head
        q.head = q.tail = NULL
        q.batches += 1
        pthread_mutex_unlock(&q.lock)
        op = batch
        while op != NULL:
            if op.kind == OP_APPEND:
                run_start = op
                while op != NULL and op.kind == OP_APPEND:
                    op = op.next
                if run_start.next == op:
                    run_start.err = write_durable(run_start)
                    q.appends += 1
                    q.syncs += 1
                    q.bytes += <uint64_t>(run_start.head_len + run_start.length)
                else:
                    write_run(q, run_start, op)
                    sync_run(q, run_start, op)
                complete_appends(q, run_start, op)
            elif op.kind == OP_CALL:
                # every append queued before it is durable (the runs above completed first)
                run_call(op)
                op = op.next
            else:
                stopping = True
                op = op.next
        last = batch
        while last.next != NULL:
            last = last.next
        to_garbage(q, batch, last)
    PyEval_RestoreThread(tstate)
    PyGILState_Release(gstate)
    return NULL


cdef class DriveQueue:
    """One drive's writer thread. ``on_error(ticket, zone_idx, errno, during)`` runs (with the
    GIL, in that thread) for a failed append before its ticket is counted down."""

    cdef QueueState *q
    cdef pthread_t thread
    cdef bint started
    cdef bint stopped
    cdef object on_error_ref

    def __cinit__(self, on_error):
        self.q = <QueueState *>calloc(1, sizeof(QueueState))
        if self.q == NULL:
            raise MemoryError()
        pthread_mutex_init(&self.q.lock, NULL)
        pthread_cond_init(&self.q.cond, NULL)
        self.on_error_ref = on_error
        self.q.on_error = <PyObject *>on_error
        if pthread_create(&self.thread, NULL, writer_main, <void *>self.q) != 0:
            raise OSError("could not start a drive writer thread")
        self.started = True

    cdef void push(self, Op *op):
        cdef Op *garbage
        pthread_mutex_lock(&self.q.lock)
        garbage = self.q.garbage
        self.q.garbage = NULL
        if self.q.tail == NULL:
            self.q.head = self.q.tail = op
        else:
            self.q.tail.next = op
            self.q.tail = op
        pthread_cond_signal(&self.q.cond)
        pthread_mutex_unlock(&self.q.lock)
        release_ops(garbage)

    def append(self, int fd, off_t offset, data, Ticket ticket, int zone_idx):
        """Queue ``data`` for pwrite at ``offset`` of ``fd``; ``ticket`` counts it once durable.
        ``data`` must stay as it is until then: neither changed, resized nor released (bytes,
        or the fragments of a stripe, which the data path frees after the commit)."""
        self.push(self.append_op(fd, offset, None, data, ticket, zone_idx))

    def append_parts(self, int fd, off_t offset, head, data, Ticket ticket, int zone_idx):
        """Like ``append`` of ``head`` followed by ``data``, written by one pwritev: a fragment
        whose payload is a slice of its stripe's buffer, after a header of its own."""
        self.push(self.append_op(fd, offset, head, data, ticket, zone_idx))

    cdef Op *append_op(self, int fd, off_t offset, head, data, Ticket ticket, int zone_idx) except NULL:
        if self.stopped:
            raise RuntimeError("the drive's writer has stopped")
        cdef Op *op = <Op *>calloc(1, sizeof(Op))
        if op == NULL:
            raise MemoryError()
        cdef Py_buffer view
        if PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) != 0:
            free(op)
            raise TypeError("expected a bytes-like object")
        # no buffer export is held past this call: the owner of memory such as an encoder's
        # fragments frees it after the ticket completes, and a held export would stop that
        op.buf = <const char *>view.buf
        op.length = <size_t>view.len
        PyBuffer_Release(&view)
        if head is not None:
            if PyObject_GetBuffer(head, &view, PyBUF_SIMPLE) != 0:
                free(op)
                raise TypeError("expected a bytes-like object")
            op.head = <const char *>view.buf
            op.head_len = <size_t>view.len
            PyBuffer_Release(&view)
            Py_INCREF(head)
            op.head_owner = <PyObject *>head
        Py_INCREF(data)
        op.owner = <PyObject *>data
        op.kind = OP_APPEND
        op.fd = fd
        op.offset = offset
        op.zone_idx = zone_idx
        op.tstate = ticket.st
        Py_INCREF(ticket)
        op.ticket = <PyObject *>ticket
        return op

    def call(self, fn):
        """Run ``fn()`` in the writer thread once everything queued before it is durable."""
        if self.stopped:
            raise RuntimeError("the drive's writer has stopped")
        cdef Op *op = <Op *>calloc(1, sizeof(Op))
        if op == NULL:
            raise MemoryError()
        op.kind = OP_CALL
        Py_INCREF(fn)
        op.ticket = <PyObject *>fn
        self.push(op)

    def stop(self):
        """Finish everything queued, then end the thread (idempotent)."""
        cdef Op *op
        if self.stopped:
            return
        self.stopped = True
        op = <Op *>calloc(1, sizeof(Op))
        if op == NULL:
            raise MemoryError()
        op.kind = OP_STOP
        self.push(op)
        with nogil:
            pthread_join(self.thread, NULL)
        self.started = False
        pthread_mutex_lock(&self.q.lock)
        op = self.q.garbage
        self.q.garbage = NULL
        pthread_mutex_unlock(&self.q.lock)
        release_ops(op)

    def counters(self):
        """Appends, bytes, fdatasyncs, batches and seconds spent writing and syncing."""
        with nogil:
            pthread_mutex_lock(&self.q.lock)
        out = {
            "appends": self.q.appends,
            "bytes": self.q.bytes,
            "syncs": self.q.syncs,
            "batches": self.q.batches,
            "write_s": self.q.write_ns / 1e9,
            "sync_s": self.q.sync_ns / 1e9,
        }
        pthread_mutex_unlock(&self.q.lock)
        return out

    def __dealloc__(self):
        if self.q == NULL:
            return
        if self.started:
            # never stopped: the thread still uses the state; leave it (the process is ending)
            return
        pthread_mutex_destroy(&self.q.lock)
        pthread_cond_destroy(&self.q.cond)
        free(self.q)
        self.q = NULL
