"""The NFSv4.1 backchannel under RPCSEC_GSS (RFC 8881 2.10.8.3, 18.33, 18.36) against a real
MIT KDC (tests/kdcserver.py): a raw Kerberos client names its own context for callbacks in
CREATE_SESSION and checks every callback it gets itself (the credential carries its handle,
the header MIC verifies, the arguments unwrap under the service it chose) and answers under
the same context; an unknown or foreign handle gets NOENT, a gone context
CB_GSS_CONTEXTS_EXPIRED (and no delegation) until BACKCHANNEL_CTL names a new one."""

from __future__ import annotations

import json
import os
import struct
import time

import pytest

pytest.importorskip("gssapi", reason="scripts/bootstrap.sh installs gssapi (pip) and libkrb5-dev")

from gss_rawclient import (  # noqa: E402 - after the skip
    SVC_INTEGRITY,
    SVC_NONE,
    SVC_PRIVACY,
    GssRawClient,
    opaque,
    read_opaque,
)
from kdcserver import SERVER_HOST, KdcServer  # noqa: E402
from nfs4_rawclient import RawClient, open_args  # noqa: E402
from nfs4_support import add_export, start_server  # noqa: E402

from appliance.nfs.onc.xdr import UInt  # noqa: E402
from appliance.nfs.v4 import backchannel as cb  # noqa: E402
from appliance.nfs.v4 import const as c  # noqa: E402
from appliance.nfs.v4 import types as t  # noqa: E402
from engine.namespace import ROOT  # noqa: E402

TARGET = f"nfs@{SERVER_HOST}"
CB_PROGRAM = 0x40000321
EXPIRED, EXPIRING = c.SEQ4_STATUS_CB_GSS_CONTEXTS_EXPIRED, c.SEQ4_STATUS_CB_GSS_CONTEXTS_EXPIRING
FILES = ("f-none", "f-integrity", "f-privacy", "f-again")


@pytest.fixture(scope="module")
def kdc():
    # a realm of its own: the clients' in-memory ccaches are named by principal, and another
    # module's KDC (test_gss.py) issues tickets for the same names under other keys
    # clockskew: a context lives this long past its ticket
    server = KdcServer(realm="BACKCHANNEL.TEST", clockskew=1).start()
    server.add_user("daemon")  # uid 1 in every Debian's passwd
    server.add_user("root")
    server.add_user("brief", maxlife="2 minutes")  # a context that ends within GSS_EXPIRING_S
    yield server
    server.stop()


@pytest.fixture
def gss_server(stack, kdc):
    add_export(stack.catalog, name="/export", sec="krb5p:krb5i:krb5:sys")
    ns = stack.namespace
    for name in FILES:
        f = ns.create(ROOT, ns.root_ino, name, 0o644)
        ns.write(f.ino, 0, b"cached " + name.encode(), stable=True)
        ns.setattr(ROOT, f.ino, uid=1, gid=1)
    srv = start_server(stack, krb5_keytab=str(kdc.server_keytab), lease_seconds=5)
    yield srv
    srv.stop()


class GssCallbackClient(GssRawClient):
    """A Kerberos raw client whose session takes callbacks under RPCSEC_GSS: each callback
    met among the replies is checked as a GSS acceptor of our own context would check it,
    kept (``callbacks``: gss procedure, sequence number, service, handle, plain arguments)
    and answered under the same context."""

    def __init__(self, port: int, kdc, user: str = "daemon", service=SVC_PRIVACY):
        super().__init__(port, f"{user}@{kdc.realm}", kdc.client_keytab, TARGET, service)
        self.cb_handle = os.urandom(8)  # the handle the server's callbacks must carry
        self.callbacks: list[tuple[int, int, int, bytes, bytes]] = []
        self.establish()

    def recv_record(self) -> bytes:
        while True:
            record = RawClient.recv_record(self)
            if struct.unpack_from(">I", record, 4)[0] != 0:  # a REPLY to one of ours
                return record
            self._callback(record)

    def _callback(self, record: bytes) -> None:
        xid, _, _, prog, vers, proc = struct.unpack_from(">IIIIII", record, 0)
        assert (prog, vers, proc) == (CB_PROGRAM, 1, cb.CB_COMPOUND)
        flavor = struct.unpack_from(">I", record, 24)[0]
        assert flavor == 6, f"a callback under flavour {flavor}, not RPCSEC_GSS"
        cred, pos = read_opaque(record, 28)
        header = record[:pos]
        vflavor = struct.unpack_from(">I", record, pos)[0]
        verf, pos = read_opaque(record, pos + 4)
        version, gproc, seq, service = struct.unpack_from(">IIII", cred, 0)
        handle, _ = read_opaque(cred, 16)
        assert version == 1 and vflavor == 6
        self.ctx.verify_signature(header, verf)  # raises for a forged or foreign header MIC
        args = record[pos:]
        if service != SVC_NONE:
            if service == SVC_INTEGRITY:
                data, p2 = read_opaque(args, 0)
                mic, _ = read_opaque(args, p2)
                self.ctx.verify_signature(data, mic)
            else:
                unwrapped = self.ctx.unwrap(read_opaque(args, 0)[0])
                assert unwrapped.encrypted
                data = unwrapped.message
            assert struct.unpack_from(">I", data, 0)[0] == seq
            args = data[4:]
        self.callbacks.append((gproc, seq, service, handle, args))
        results = _cb_results(args)
        if service == SVC_INTEGRITY:
            body = struct.pack(">I", seq) + results
            results = opaque(body) + opaque(self.ctx.get_signature(body))
        elif service == SVC_PRIVACY:
            results = opaque(self.ctx.wrap(struct.pack(">I", seq) + results, True).message)
        verifier = struct.pack(">I", 6) + opaque(self.ctx.get_signature(struct.pack(">I", seq)))
        self.send_record(struct.pack(">III", xid, 1, 0) + verifier + struct.pack(">I", 0) + results)

    def create_session(self, sec_parms, flags=c.CREATE_SESSION4_FLAG_CONN_BACK_CHAN) -> int:
        """EXCHANGE_ID and CREATE_SESSION with these callback credentials: the latter's status."""
        eid_args = t.ARGS[c.OP_EXCHANGE_ID](os.urandom(8), os.urandom(8), 0, (c.SP4_NONE, None), [])
        st, res = self.compound([(c.OP_EXCHANGE_ID, eid_args)])
        assert st == 0, st
        eid = res[0][2]
        self.clientid = eid.clientid
        chan = t.channel_attrs4.cls(0, 1 << 20, 1 << 20, 1 << 16, 16, 8, [])
        back = t.channel_attrs4.cls(0, 8192, 8192, 0, 2, 1, [])
        args = t.ARGS[c.OP_CREATE_SESSION](
            eid.clientid, eid.sequenceid, flags, chan, back, CB_PROGRAM, sec_parms
        )
        st, res = self.compound([(c.OP_CREATE_SESSION, args)])
        if st == 0:
            self.sessionid = res[0][2].sessionid
            self.seq = {i: 0 for i in range(8)}
            assert self.session([(c.OP_RECLAIM_COMPLETE, False)])[0] == 0
        return st

    def gss_parms(self, service: int, context: GssRawClient | None = None) -> list:
        """callback_sec_parms4 naming ``context`` (this client's own by default)."""
        handle = (context or self).handle
        return [(c.RPCSEC_GSS, t.gss_cb_handles4.cls(service, handle, self.cb_handle))]

    def flags(self) -> int:
        st, res = self.session([])
        assert st == 0, st
        return res[0][2].status_flags

    def open_read(self, name: str):
        """OPEN ``name`` for reading and CLOSE it: (handle, the delegation's kind and stateid)."""
        st, res = self.session(
            [
                (c.OP_PUTROOTFH, None),
                (c.OP_LOOKUP, "export"),
                (c.OP_OPEN, open_args(name, b"o", self.clientid, c.OPEN4_SHARE_ACCESS_READ, False)),
                (c.OP_GETFH, None),
            ]
        )
        assert st == 0, (st, res)
        ok, fh = res[3][2], res[4][2]
        st, _ = self.session([(c.OP_PUTFH, fh), (c.OP_CLOSE, t.ARGS[c.OP_CLOSE](0, ok.stateid))])
        assert st == 0, st
        kind, deleg = ok.delegation
        return fh, kind, (deleg.stateid if kind == c.OPEN_DELEGATE_READ else None)


def _cb_results(args: bytes) -> bytes:
    """CB_COMPOUND4res answering CB_SEQUENCE and one more operation with NFS4_OK."""
    _, pos = cb.CB_COMPOUND4args_head.unpack(args, 0)
    _, pos = UInt.unpack(args, pos)
    _, pos = UInt.unpack(args, pos)  # OP_CB_SEQUENCE
    seq, pos = cb.CB_SEQUENCE4args.unpack(args, pos)
    op, _ = UInt.unpack(args, pos)
    out = struct.pack(">IIIII", 0, 0, 2, cb.OP_CB_SEQUENCE, 0) + seq.sessionid
    out += struct.pack(">IIII", seq.sequenceid, seq.slotid, seq.highest_slotid, seq.highest_slotid)
    return out + struct.pack(">II", op, 0)


def _recalled(args: bytes) -> bytes | None:
    """The stateid's ``other`` of a CB_RECALL, None for another operation."""
    _, pos = cb.CB_COMPOUND4args_head.unpack(args, 0)
    _, pos = UInt.unpack(args, pos)
    _, pos = UInt.unpack(args, pos)
    _, pos = cb.CB_SEQUENCE4args.unpack(args, pos)
    op, pos = UInt.unpack(args, pos)
    if op != cb.OP_CB_RECALL:
        return None
    recall, _ = cb.CB_RECALL4args.unpack(args, pos)
    return bytes(recall.stateid.other)


def _writer_open(writer: RawClient, name: str) -> int:
    st, _ = writer.session(
        [
            (c.OP_PUTROOTFH, None),
            (c.OP_LOOKUP, "export"),
            (c.OP_OPEN, open_args(name, b"w", writer.clientid, c.OPEN4_SHARE_ACCESS_WRITE, False)),
        ]
    )
    return st


def _recall_and_return(holder: GssCallbackClient, writer: RawClient, name: str, fh, dsid):
    """Another client's OPEN for write waits (DELAY) while the holder hears CB_RECALL over its
    GSS backchannel; after DELEGRETURN it goes through."""
    assert _writer_open(writer, name) == c.NFS4ERR_DELAY
    deadline = time.monotonic() + 10
    while not any(_recalled(args) == bytes(dsid.other) for *_, args in holder.callbacks):
        assert time.monotonic() < deadline, f"no CB_RECALL of {name}: {holder.callbacks}"
        holder.session([])  # the callback arrives among the replies
        time.sleep(0.05)
    st, _ = holder.session([(c.OP_PUTFH, fh), (c.OP_DELEGRETURN, dsid)])
    assert st == 0, st
    assert _writer_open(writer, name) == 0


def test_callbacks_go_under_the_context_and_service_the_client_named(gss_server, kdc):
    writer = RawClient(gss_server.port).setup()  # AUTH_SYS root: the conflicting client
    holders = []
    try:
        for name, service in zip(FILES[:3], (SVC_NONE, SVC_INTEGRITY, SVC_PRIVACY), strict=True):
            # the fore channel under krb5p, the backchannel under the service named for it
            holder = GssCallbackClient(gss_server.port, kdc, service=SVC_PRIVACY)
            holders.append(holder)
            assert holder.create_session(holder.gss_parms(service)) == 0
            assert holder.flags() & (EXPIRED | EXPIRING | c.SEQ4_STATUS_CB_PATH_DOWN) == 0
            fh, kind, dsid = holder.open_read(name)
            assert kind == c.OPEN_DELEGATE_READ, (service, kind)
            _recall_and_return(holder, writer, name, fh, dsid)
            # every callback carried our handle, a fresh sequence number, the named service
            assert holder.callbacks and all(
                (gproc, svc, handle) == (0, service, holder.cb_handle)
                for gproc, _, svc, handle, _ in holder.callbacks
            ), holder.callbacks
            seqs = [seq for _, seq, *_ in holder.callbacks]
            assert seqs == sorted(set(seqs)), seqs
    finally:
        writer.close()
        for holder in holders:
            holder.close()


def test_unknown_gone_and_foreign_contexts(gss_server, kdc):
    port = gss_server.port
    holder = GssCallbackClient(port, kdc)
    other_user = GssCallbackClient(port, kdc, user="root")
    spare = GssCallbackClient(port, kdc)  # a second context of the same user, for callbacks
    brief = GssCallbackClient(port, kdc, user="brief")
    try:
        # a handle this server never gave, another principal's context, a bad service
        unknown = [(c.RPCSEC_GSS, t.gss_cb_handles4.cls(SVC_NONE, os.urandom(16), b"cb"))]
        assert holder.create_session(unknown) == c.NFS4ERR_NOENT
        assert holder.create_session(holder.gss_parms(SVC_NONE, other_user)) == c.NFS4ERR_NOENT
        assert holder.create_session(holder.gss_parms(7)) == c.NFS4ERR_INVAL
        # callbacks under the spare context; once it is destroyed, SEQUENCE says so and no
        # delegation is granted (a callback could not be sent)
        assert holder.create_session(holder.gss_parms(SVC_INTEGRITY, spare)) == 0
        assert holder.flags() & EXPIRED == 0
        spare.destroy()
        assert holder.flags() & EXPIRED
        _, kind, _ = holder.open_read("f-again")
        assert kind == c.OPEN_DELEGATE_NONE
        # BACKCHANNEL_CTL naming a foreign context: NOENT; naming its own: delegations again
        ctl = t.ARGS[c.OP_BACKCHANNEL_CTL]
        st, _ = holder.session(
            [(c.OP_BACKCHANNEL_CTL, ctl(CB_PROGRAM, holder.gss_parms(SVC_NONE, other_user)))]
        )
        assert st == c.NFS4ERR_NOENT
        # the session's record keeps what BACKCHANNEL_CTL set (a restart restores the session
        # with it; of RPCSEC_GSS the flavour alone, its context being gone then)
        key = f"nfs_session_{bytes(holder.sessionid).hex()}"
        st, _ = holder.session([(c.OP_BACKCHANNEL_CTL, ctl(CB_PROGRAM + 1, [(c.AUTH_NONE, None)]))])
        assert st == 0
        record = json.loads(gss_server.server.catalog.get_setting(key))
        assert record["callback"] == [CB_PROGRAM + 1, [[c.AUTH_NONE]]]
        st, _ = holder.session(
            [(c.OP_BACKCHANNEL_CTL, ctl(CB_PROGRAM, holder.gss_parms(SVC_PRIVACY)))]
        )
        assert st == 0
        assert holder.flags() & EXPIRED == 0
        record = json.loads(gss_server.server.catalog.get_setting(key))
        assert record["callback"] == [CB_PROGRAM, [[c.RPCSEC_GSS]]]
        fh, kind, dsid = holder.open_read("f-again")
        assert kind == c.OPEN_DELEGATE_READ
        writer = RawClient(port).setup()
        try:
            _recall_and_return(holder, writer, "f-again", fh, dsid)
        finally:
            writer.close()
        assert holder.callbacks[-1][2:4] == (SVC_PRIVACY, holder.cb_handle)
        # a context whose ticket ends within minutes: SEQUENCE warns the client ahead
        assert brief.create_session(brief.gss_parms(SVC_NONE)) == 0
        assert brief.flags() & (EXPIRING | EXPIRED) == EXPIRING
    finally:
        for raw in (holder, other_user, spare, brief):
            raw.close()
