"""smbd in a systemd unit of its own (shingle-smbd.service), for a daemon that is not root.

smbd switches to each SMB user, so it runs as root; the daemon (shingle-nfsd.service) runs as
the service user with NoNewPrivileges, in a private mount namespace, and can neither mount
FUSE nor run smbd. The work is split:

- the daemon (``FuseHandover``, a thread of ``shingle serve`` when it is not root) writes
  smb.conf and the nss files as before, and listens on ``DATA_DIR/smb/fuse.sock``;
- ``shingle smbd`` (the unit's main process, root) opens /dev/fuse, mounts it on ``mount``
  in the unit's RuntimeDirectory (/run/shingle-smbd, which every SMB user may traverse, unlike
  the daemon's 0750 state folder) in its own mount namespace (where smbd sees it), hands the
  descriptor and that path to the daemon over that socket (SCM_RIGHTS; the daemon writes the
  path into smb.conf before it answers), and supervises smbd: it checks the
  VFS modules, sends SIGHUP when the daemon rewrites smb.conf, restarts smbd when it exits.
  smbd itself runs without CAP_SYS_ADMIN and CAP_SETPCAP (dropped from its bounding set
  before exec).

The daemon serves the FUSE requests on the descriptor it received; when it restarts, the
mount answers ENOTCONN and ``shingle smbd`` stops smbd, unmounts, waits for the new daemon and
mounts again. When the unit stops, its namespace and with it the mount go away: the daemon's
FUSE loop ends and it waits for the next hand-over, serving NFS all the while."""

from __future__ import annotations

import array
import ctypes
import errno
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from appliance.smb.samba import SambaLayout, SmbdSupervisor, give_private_to_owner

if TYPE_CHECKING:
    from appliance.smb.mount import FuseMount

log = logging.getLogger("shingle.smb")

HANDOVER_OK = b"serving\n"
MOUNT_WORD = b"mount "  # the hand-over: b"mount /PATH" with the descriptor
WAIT_DAEMON_S = 1.0  # how often `shingle smbd` looks for the daemon's socket
MS_NOSUID, MS_NODEV, MS_NOATIME = 0x2, 0x4, 0x400
MNT_DETACH = 2
PR_CAPBSET_DROP, CAP_SYS_ADMIN, CAP_SETPCAP = 24, 21, 8
# the daemon's smbd runtime folders that smbd, as root, insists on owning (lock and pid dirs are
# checked strictly: owner = smbd's uid, mode 0755)
ROOT_DIRS = ("lock", "pid", "ncalrpc", "state", "cache", "log")


def _libc():
    return ctypes.CDLL(None, use_errno=True)


# -- the daemon's side ----------------------------------------------------------------------------
class FuseHandover(threading.Thread):
    """Serves the namespace on each /dev/fuse descriptor shingle-smbd.service hands over (one at
    a time: pyfuse3 holds one session per process)."""

    def __init__(self, namespace, layout: SambaLayout, on_mount=lambda mountpoint: None):
        super().__init__(name="fuse-handover", daemon=True)
        self.namespace, self.layout = namespace, layout
        self.on_mount = on_mount  # the mount's path, before the unit hears "serving"
        self.mount: FuseMount | None = None
        self.handovers = 0
        self._stopping = threading.Event()
        self._sock: socket.socket | None = None

    def listen(self) -> None:
        path = self.layout.fuse_socket
        path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.bind(str(path))
        os.chmod(path, 0o600)  # root (the unit) and the service user only
        sock.listen(1)
        sock.settimeout(1.0)
        self._sock = sock
        log.info("waiting for shingle-smbd.service to hand over the SMB mount on %s", path)

    def run(self) -> None:
        assert self._sock is not None, "listen() first"
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                raise
            with conn:
                try:
                    self._serve_one(conn)
                except Exception:  # noqa: BLE001 - the next hand-over may work
                    log.exception("SMB mount hand-over")

    def _serve_one(self, conn: socket.socket) -> None:
        from appliance.smb.mount import FuseMount

        uid = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        peer_uid = int.from_bytes(uid[4:8], "little")
        if peer_uid not in (0, os.geteuid()):
            log.error("SMB mount hand-over refused: peer uid %d is not root", peer_uid)
            return
        conn.settimeout(30)
        fds = array.array("i")
        message, ancillary, _, _ = conn.recvmsg(4096, socket.CMSG_SPACE(fds.itemsize))
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        mountpoint = Path(os.fsdecode(message.removeprefix(MOUNT_WORD)))
        if len(fds) != 1 or not message.startswith(MOUNT_WORD) or not mountpoint.is_absolute():
            for fd in fds:
                os.close(fd)
            log.error(
                "SMB mount hand-over refused: %d descriptors (1 expected), message %r "
                "('mount /ABSOLUTE/PATH' expected)",
                len(fds),
                message[:100],
            )
            return
        mount = self.mount = FuseMount(
            self.namespace, mountpoint, allow_other=True, device_fd=fds[0]
        )
        mount.start()
        self.on_mount(mountpoint)
        self.handovers += 1
        conn.sendall(HANDOVER_OK)
        log.info("serving the SMB mount of shingle-smbd.service (hand-over %d)", self.handovers)
        while mount.alive() and not self._stopping.wait(1.0):
            pass
        mount.stop()
        self.mount = None
        if not self._stopping.is_set():
            log.warning("the SMB mount went away (shingle-smbd.service stopped or remounts)")

    def stop(self) -> None:
        self._stopping.set()
        if self._sock is not None:
            self._sock.close()
        if self.is_alive():
            self.join(60)
        if self.mount is not None:
            self.mount.stop()
        self.layout.fuse_socket.unlink(missing_ok=True)


# -- shingle-smbd.service's side ------------------------------------------------------------------
def mount_fuse(mountpoint: Path, uid: int, gid: int) -> int:
    """Open /dev/fuse and mount it on ``mountpoint`` (the kernel's own mount(2), as fusermount3
    does); returns the descriptor whose reader serves the mount."""
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    data = f"fd={fd},rootmode=40000,user_id={uid},group_id={gid},allow_other"
    flags = MS_NOSUID | MS_NODEV | MS_NOATIME
    if _libc().mount(b"shingle", bytes(mountpoint), b"fuse.shingle", flags, data.encode()) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"mount of /dev/fuse on {mountpoint}: {os.strerror(err)}")
    return fd


def unmount(mountpoint: Path) -> None:
    """Lazily: smbd may still hold files open on a mount whose daemon went away."""
    if _libc().umount2(bytes(mountpoint), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not mounted
            log.warning("umount %s: %s", mountpoint, os.strerror(err))


def mount_answers(mountpoint: Path) -> bool:
    """The daemon behind the mount still serves it (a dead one leaves ENOTCONN)."""
    try:
        os.stat(mountpoint)
    except OSError:
        return False
    return os.path.ismount(mountpoint)


def hand_over(sock_path: Path, fd: int, mountpoint: Path, timeout: float = 60.0) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout)
        sock.connect(str(sock_path))
        sock.sendmsg(
            [MOUNT_WORD + bytes(mountpoint)],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))],
        )
        reply = sock.recv(64)
    if reply != HANDOVER_OK:
        raise OSError(errno.EPROTO, f"the daemon did not take the SMB mount: {reply!r}")


def _drop_sys_admin() -> None:
    """In smbd's child before exec: the mount is done, smbd needs no CAP_SYS_ADMIN, and then no
    CAP_SETPCAP (the one that lets a process drop capabilities from its bounding set)."""
    libc = _libc()
    for capability in (CAP_SYS_ADMIN, CAP_SETPCAP):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"dropping capability {capability} before smbd: {os.strerror(err)}")


class UnitSmbd(SmbdSupervisor):
    """SmbdSupervisor for shingle-smbd.service: the daemon writes smb.conf and the nss files;
    this one reloads smbd when they change on disk."""

    def __init__(self, layout: SambaLayout, *, mount: Path, host: str, port: int, mount_alive):
        super().__init__(None, layout, mount=mount, host=host, port=port, mount_alive=mount_alive)
        self._seen: tuple = ()
        self.preexec = _drop_sys_admin

    def _refresh(self) -> bool:
        give_private_to_owner(self.layout)  # secrets.tdb that smbd made, for the web UI's pdbedit
        seen = tuple(
            path.read_bytes() if path.exists() else b""
            for path in (self.layout.conf, self.layout.passwd, self.layout.group)
        )
        changed, self._seen = seen != self._seen, seen
        return changed


def own_smbd_dirs(layout: SambaLayout) -> None:
    """smbd, as root, refuses lock and pid folders another user owns (the daemon made them)."""
    for name in ROOT_DIRS:
        folder = layout.dir(name)
        folder.mkdir(exist_ok=True)
        os.chown(folder, 0, 0)
        folder.chmod(0o755)


def serve_smbd_unit(config, stop: threading.Event) -> int:
    """`shingle smbd`: mount, hand over, supervise smbd; again after each daemon restart."""
    port = config.get("smb.port")
    if not port:
        print("SMB is off (smb.port = 0 in the config): nothing to run", flush=True)
        return 0
    host = config.get("smb.host")
    layout = SambaLayout.for_data_dir(config.data_dir)
    # systemd's RuntimeDirectory= (0755): SMB users reach the mount; the daemon's folders are 0750
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    mountpoint = Path(runtime) / "mount" if runtime else layout.mount
    while not stop.is_set():
        if not (layout.fuse_socket.exists() and layout.conf.exists()):
            stop.wait(WAIT_DAEMON_S)  # the daemon is not up (yet, or again)
            continue
        daemon = os.stat(layout.root)
        mountpoint.mkdir(exist_ok=True)
        unmount(mountpoint)  # a mount of a daemon that went away
        fd = mount_fuse(mountpoint, daemon.st_uid, daemon.st_gid)
        try:
            hand_over(layout.fuse_socket, fd, mountpoint)
        except OSError as exc:
            # refused: the socket of a daemon that went away, until the next one listens
            quiet = isinstance(exc, ConnectionRefusedError | FileNotFoundError)
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "SMB mount hand-over to the daemon failed: %s; trying again",
                exc,
            )
            unmount(mountpoint)
            stop.wait(WAIT_DAEMON_S)
            continue
        finally:
            os.close(fd)
        log.info("the daemon serves the SMB mount %s", mountpoint)
        own_smbd_dirs(layout)
        supervisor = UnitSmbd(
            layout,
            mount=mountpoint,
            host=host,
            port=port,
            mount_alive=lambda: mount_answers(mountpoint),
        )
        supervisor.start()
        while supervisor.is_alive() and not stop.wait(1.0):
            pass
        supervisor.stop()
        unmount(mountpoint)
    return 0


def install_stop_signals() -> threading.Event:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    return stop
