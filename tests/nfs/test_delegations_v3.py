"""NFSv3 and NLM against an NFSv4.1 client's read delegation: nfs-rs over NFSv3 (a real v3
client) writes, chmods, renames and removes delegated files, each change waiting
(NFS3ERR_JUKEBOX, which nfs-rs surfaces or retries) until the holder, recalled first, returns
the delegation; an exclusive NLM lock recalls too and is answered DENIED_GRACE_PERIOD
meanwhile (Linux lockd waits and asks again: never a lasting DENIED), a shared one does not."""

from __future__ import annotations

import struct
import threading
import time

import pytest
from nfs4_rawclient import RawClient
from nfs4_support import add_export, nfsrs, start_server
from test_delegations import CallbackClient, make_file, read_delegation

from appliance.nfs.nlm import types as n
from appliance.nfs.v4 import const as c

LEASE = 3


@pytest.fixture
def deleg_server(stack):
    add_export(stack.catalog)
    srv = start_server(stack, lease_seconds=LEASE, grace_seconds=0)
    yield srv
    srv.stop()


def nlm_lock(raw: RawClient, fh: bytes, *, exclusive: bool, svid: int = 7) -> int:
    alock = n.nlm4_lock.cls("v3host", fh, f"{svid}@v3host".encode(), svid, 0, 0)
    args = n.nlm4_lockargs.cls(struct.pack(">I", svid), False, exclusive, alock, False, 3)
    reply = raw.call_raw(
        n.NLMPROC4_LOCK, n.NLM_ARGS[n.NLMPROC4_LOCK].encode(args), prog=n.NLM_PROGRAM, vers=4
    )
    vlen = struct.unpack_from(">I", reply, 16)[0]
    pos = 20 + vlen + (-vlen % 4)
    assert struct.unpack_from(">I", reply, pos)[0] == 0  # accepted
    return n.NLM_RESULTS[n.NLMPROC4_LOCK].decode(reply[pos + 4 :]).stat


def _exclusive_nlm_lock_recalls_first(deleg_server):
    port = deleg_server.port
    make_file(port, "locked")
    holder = CallbackClient(port).setup()
    fh, dsid = read_delegation(holder, "locked")
    v3 = RawClient(port)
    # a shared lock is no write: the delegation stays
    assert nlm_lock(v3, fh, exclusive=False, svid=1) == n.NLM4_GRANTED
    assert holder.recalls() == []
    assert nlm_lock(v3, fh, exclusive=True, svid=2) == n.NLM4_DENIED_GRACE_PERIOD
    assert [s.other for s in holder.wait_for_recall()] == [dsid.other]
    assert nlm_lock(v3, fh, exclusive=True, svid=2) == n.NLM4_DENIED_GRACE_PERIOD
    st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
    assert st == 0, st
    # lockd's retry: the shared lock of svid 1 is the same host's, so svid 2 waits for it
    # (DENIED), proving the range check ran, not the recall; freeing it grants svid 2
    assert nlm_lock(v3, fh, exclusive=True, svid=2) == n.NLM4_DENIED
    assert nlm_lock(v3, fh, exclusive=True, svid=1) == n.NLM4_GRANTED  # an upgrade of its own
    v3.close()
    holder.close()


def _retrying(what, timeout: float = 30.0) -> tuple[int, str]:
    """Run ``what`` until it does not raise NfsRetryableError (nfs-rs reports JUKEBOX as
    "try again" and leaves the retry to its caller): (tries, last error)."""
    import nfs_rs

    deadline = time.monotonic() + timeout
    tries, last = 0, ""
    while True:
        tries += 1
        try:
            what()
            return tries, last
        except nfs_rs.NfsRetryableError as exc:
            last = str(exc)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_nlm_and_nfsrs_v3_changes_wait_for_the_return(deleg_server):
    _exclusive_nlm_lock_recalls_first(deleg_server)  # (one server start for both)
    port = deleg_server.port
    names = ("w", "s", "r", "x")
    for name in names:
        make_file(port, f"v3-{name}", b"old bytes")
    holder = CallbackClient(port).setup()
    held = {name: read_delegation(holder, f"v3-{name}") for name in names}

    def write(cl) -> None:
        with cl.open("v3-w", "r+b") as f:
            f.write(b"new bytes")

    changes = {
        "w": write,
        "s": lambda cl: cl.chmod("v3-s", 0o600),
        "r": lambda cl: cl.rename("v3-r", "v3-r-moved"),
        "x": lambda cl: cl.remove("v3-x"),
    }
    with nfsrs(port, version="3") as v3:
        for name in names:
            fh, dsid = held[name]
            outcome: dict = {}

            def change(name=name, outcome=outcome):
                try:
                    outcome["tries"] = _retrying(lambda: changes[name](v3))
                except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                    outcome["error"] = exc

            worker = threading.Thread(target=change)
            worker.start()
            recalled = holder.wait_for_recall()
            assert dsid.other in [s.other for s in recalled], (name, recalled)
            time.sleep(0.3)
            assert worker.is_alive(), f"{name}: the change did not wait: {outcome}"
            st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
            assert st == 0, st
            worker.join(40)
            assert "error" not in outcome and "tries" in outcome, (name, outcome)
            holder.callbacks.clear()
        with v3.open("v3-w", "rb") as f:
            assert f.read() == b"new bytes"
        assert v3.stat("v3-s").mode & 0o777 == 0o600
        assert sorted(v3.listdir("/")) == sorted(["locked", "v3-w", "v3-s", "v3-r-moved"])
    counts = deleg_server.server.state.delegations.counts
    # one recall and return before, of the NLM part's file
    assert (counts["recalled"], counts["returned"], counts["revoked"]) == (5, 5, 0)
    holder.close()
