"""RPCSEC_GSS with Kerberos 5 against a real MIT KDC (tests/kdcserver.py) started for this
module: contexts made by the python-gssapi initiator, NFSv4.1, NFSv3 and MOUNT calls under
krb5, krb5i and krb5p, and what the server refuses (replays, forged MICs, destroyed and expired
contexts, flavours an export does not allow)."""

from __future__ import annotations

import os
import socket
import struct
import time

import pytest

pytest.importorskip("gssapi", reason="scripts/bootstrap.sh installs gssapi (pip) and libkrb5-dev")

from gss_rawclient import (  # noqa: E402 - after the skip
    SVC_INTEGRITY,
    SVC_NONE,
    SVC_PRIVACY,
    Denied,
    GssRawClient,
    opaque,
    read_opaque,
)
from kdcserver import SERVER_HOST, KdcServer  # noqa: E402
from nfs4_rawclient import RawClient, stateid  # noqa: E402
from nfs4_support import add_export, start_server  # noqa: E402

from appliance.nfs.onc.gss import SeqWindow  # noqa: E402
from appliance.nfs.v3 import types as t3  # noqa: E402
from appliance.nfs.v4 import const as c  # noqa: E402
from appliance.nfs.v4 import types as t  # noqa: E402
from engine.admin import nfs_clients  # noqa: E402
from engine.namespace import ROOT  # noqa: E402

AUTH_TOOWEAK = 5
CREDPROBLEM, CTXPROBLEM = 13, 14
GARBAGE_ARGS = 4
TARGET = f"nfs@{SERVER_HOST}"
SECRET = b"only daemon may read this\n"
DOMAIN = "shingle.test"
OWNERS = [0, 1 << (c.FATTR4_OWNER - 32) | 1 << (c.FATTR4_OWNER_GROUP - 32)]
MACHINE = "krb5client"  # nfs/MACHINE@REALM: the key rpc.gssd uses for root and state
ANON = 4242


@pytest.fixture(scope="module")
def kdc():
    # the acceptor allows this much clock skew, and a context lives that long past its ticket:
    # small, so that a short ticket's context expires within the test
    server = KdcServer(clockskew=1).start()
    server.add_user("daemon")  # uid 1 in every Debian's passwd
    server.add_user("root")
    server.add_user("ghost")  # no such user: the anonymous identity
    server.add_user("brief", maxlife="4 seconds")
    server.add_service(f"nfs/{MACHINE}", server.client_keytab)  # a client host's key
    yield server
    server.stop()


@pytest.fixture
def gss_server(stack, kdc):
    add_export(stack.catalog, name="/export", sec="krb5p:krb5i:krb5", squash="root_squash")
    add_export(stack.catalog, name="/open", sec="sys")
    # root not squashed, its own anonymous identity
    add_export(stack.catalog, name="/machines", sec="krb5", anon_uid=ANON, anon_gid=ANON)
    ns = stack.namespace
    f = ns.create(ROOT, ns.root_ino, "secret", 0o600)
    ns.write(f.ino, 0, SECRET, stable=True)
    ns.setattr(ROOT, f.ino, uid=1, gid=1)
    f = ns.create(ROOT, ns.root_ino, "for-anon", 0o640)  # read by /machines's anonymous group
    ns.write(f.ino, 0, SECRET, stable=True)
    ns.setattr(ROOT, f.ino, uid=0, gid=ANON)
    srv = start_server(stack, krb5_keytab=str(kdc.server_keytab), idmap_domain=DOMAIN)
    yield srv
    srv.stop()


def client(srv, kdc, user="daemon", service=SVC_NONE) -> GssRawClient:
    raw = GssRawClient(srv.port, f"{user}@{kdc.realm}", kdc.client_keytab, TARGET, service)
    raw.establish()
    return raw


def read_secret(raw, export="export", name="secret") -> tuple[int, list]:
    return raw.session(
        [
            (c.OP_PUTROOTFH, None),
            (c.OP_LOOKUP, export),
            (c.OP_LOOKUP, name),
            (c.OP_GETATTR, [1 << c.FATTR4_SIZE, 1 << (c.FATTR4_OWNER - 32)]),
            (c.OP_READ, t.ARGS[c.OP_READ](stateid(0, b"\0" * 12), 0, 4096)),
        ]
    )


@pytest.mark.parametrize("service", [SVC_NONE, SVC_INTEGRITY, SVC_PRIVACY])
def test_null_getattr_and_read_round_trip_under_each_service(gss_server, kdc, service):
    raw = client(gss_server, kdc, service=service)
    try:
        assert raw.window >= 32
        reply = raw.gss_call(0, b"")  # NULL under the context: a verified, empty answer
        assert reply.endswith(struct.pack(">I", 0))
        raw.setup()
        st, res = read_secret(raw)
        assert st == 0, res
        assert res[-1][2].data == SECRET and res[-1][2].eof
        assert gss_server.server.stats()["nfs_gss_contexts"] >= 1
        # the client's record names its Kerberos principal (the web UI's NFS clients)
        shown = nfs_clients.list_clients(gss_server.server.catalog)
        assert f"krb5 daemon@{kdc.realm} (uid 1)" in [cl["principal"] for cl in shown]
    finally:
        raw.close()


def test_principals_map_through_the_name_service_and_squash(gss_server, kdc):
    for user, expected in (("ghost", c.NFS4ERR_ACCESS), ("root", c.NFS4ERR_ACCESS)):
        raw = client(gss_server, kdc, user=user, service=SVC_PRIVACY)
        try:
            raw.setup()
            st, _ = read_secret(raw)
            # ghost is anonymous; root@REALM is uid 0, squashed (root_squash) like AUTH_SYS root
            assert st == expected, (user, st)
        finally:
            raw.close()


def test_replayed_sequence_number_is_dropped(gss_server, kdc):
    raw = client(gss_server, kdc, service=SVC_INTEGRITY)
    try:
        raw.gss_call(0, b"")
        seq = raw.last_seq
        raw.send_gss(0, b"", seq=seq)  # the same number again: no answer
        raw.sock.settimeout(1.0)
        with pytest.raises(socket.timeout):
            raw.recv_record()
        raw.sock.settimeout(20)
        reply = raw.gss_call(0, b"")  # the next number is answered, with its own verifier
        assert struct.unpack_from(">I", reply, 0)[0] == raw.xid
        assert gss_server.server.stats()["nfs_gss_replays"] == 1
    finally:
        raw.close()


def test_sequence_window_keeps_late_numbers_and_drops_old_ones():
    window = SeqWindow(8)
    assert window.accept(10) and window.accept(7) and not window.accept(7)
    assert not window.accept(2)  # older than the window
    assert window.accept(30) and not window.accept(22) and window.accept(23)


def test_forged_header_mic_and_forged_arguments_are_refused(gss_server, kdc):
    raw = client(gss_server, kdc, service=SVC_INTEGRITY)
    try:
        raw.send_gss(0, b"", forge_mic=True)
        with pytest.raises(Denied) as denied:
            raw.receive_gss()
        assert denied.value.auth_stat == CREDPROBLEM  # as knfsd (and pynfs GSS3) answer
        raw.setup()
        body = raw.compound_bytes([raw.sequence_op(), (c.OP_PUTROOTFH, None)])
        raw.send_gss(1, body, forge_args=True)  # the arguments no longer match their MIC
        reply = raw.receive_gss()
        assert struct.unpack_from(">I", reply, len(reply) - 4)[0] == GARBAGE_ARGS
        # an unsigned call naming the handle (in clear on the wire) with a sequence number past
        # MAXSEQ is refused, and does not end the context: a signed one finds it, spent
        for forge, why in ((True, CREDPROBLEM), (False, CTXPROBLEM)):
            raw.send_gss(0, b"", seq=0x80000000, forge_mic=forge)
            with pytest.raises(Denied) as denied:
                raw.receive_gss()
            assert denied.value.auth_stat == why, forge
    finally:
        raw.close()


def test_destroyed_and_expired_contexts_are_refused(gss_server, kdc):
    raw = client(gss_server, kdc)
    try:
        raw.destroy()
        with pytest.raises(Denied) as denied:
            raw.gss_call(0, b"")
        assert denied.value.auth_stat == CREDPROBLEM
    finally:
        raw.close()
    raw = client(gss_server, kdc, user="brief")  # a 4 s ticket (and 1 s of allowed skew)
    try:
        raw.gss_call(0, b"")
        time.sleep(5.5)
        with pytest.raises(Denied) as denied:
            raw.gss_call(0, b"")
        assert denied.value.auth_stat == CTXPROBLEM
    finally:
        raw.close()


def test_auth_sys_on_a_kerberos_export_gets_wrongsec_and_secinfo(gss_server, kdc):
    raw = RawClient(gss_server.port).setup()
    try:
        st, res = raw.session([(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "export"), (c.OP_GETFH, None)])
        assert st == c.NFS4ERR_WRONGSEC and res[-1][0] == c.OP_GETFH
        st, res = raw.session(
            [(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "export"), (c.OP_SECINFO_NO_NAME, 0)]
        )
        assert st == 0, res
        flavors = [(f, None if info is None else info.service) for f, info in res[-1][2]]
        assert flavors == [(6, SVC_PRIVACY), (6, SVC_INTEGRITY), (6, SVC_NONE)]
        st, res = raw.session([(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "open"), (c.OP_GETFH, None)])
        assert st == 0, res  # the sys export still serves AUTH_SYS
    finally:
        raw.close()
    # and Kerberos on the sys-only export: WRONGSEC the other way round
    raw = client(gss_server, kdc, service=SVC_PRIVACY)
    try:
        raw.setup()
        st, _ = raw.session([(c.OP_PUTROOTFH, None), (c.OP_LOOKUP, "open"), (c.OP_GETFH, None)])
        assert st == c.NFS4ERR_WRONGSEC
    finally:
        raw.close()


def _mnt(raw, path: str):
    reply = raw.call_raw(t3.MOUNTPROC3_MNT, opaque(path.encode()), prog=t3.MOUNT_PROGRAM, vers=3)
    vlen = struct.unpack_from(">I", reply, 16)[0]
    pos = 20 + vlen + (-vlen % 4) + 4
    assert struct.unpack_from(">I", reply, pos)[0] == 0  # MNT3_OK
    fh, pos = read_opaque(reply, pos + 4)
    (count,) = struct.unpack_from(">I", reply, pos)
    return fh, list(struct.unpack_from(f">{count}I", reply, pos + 4))


def test_nfsv3_over_auth_sys_gets_tooweak_and_krb5_reads(gss_server, kdc):
    raw = RawClient(gss_server.port)
    try:
        fh, flavors = _mnt(raw, "/export")  # MNT comes over AUTH_SYS, as from mount.nfs
        assert flavors == [390005, 390004, 390003]
        reply = raw.call_raw(t3.NFSPROC3_GETATTR, opaque(fh), prog=100003, vers=3)
        # REPLY, MSG_DENIED, AUTH_ERROR, AUTH_TOOWEAK: no attributes, no data
        assert struct.unpack_from(">IIII", reply, 4) == (1, 1, 1, AUTH_TOOWEAK)
    finally:
        raw.close()
    gss = client(gss_server, kdc, service=SVC_INTEGRITY)
    try:
        reply = gss.gss_call(t3.NFSPROC3_GETATTR, opaque(fh), prog=100003, vers=3)
        vlen = struct.unpack_from(">I", reply, 16)[0]
        pos = 20 + vlen + (-vlen % 4) + 4
        assert struct.unpack_from(">I", reply, pos)[0] == 0  # NFS3_OK
    finally:
        gss.close()


def _owners(raw, export: str) -> tuple[str, str]:
    st, res = raw.session(
        [
            (c.OP_PUTROOTFH, None),
            (c.OP_LOOKUP, export),
            (c.OP_LOOKUP, "secret"),
            (c.OP_GETATTR, OWNERS),
        ]
    )
    assert st == 0, res
    vals = res[-1][2].attr_vals
    owner, pos = read_opaque(vals, 0)
    group, _ = read_opaque(vals, pos)
    return owner.decode(), group.decode()


def _set_owner(raw, owner: str) -> int:
    value = t.fattr4.cls([0, 1 << (c.FATTR4_OWNER - 32)], opaque(owner.encode()))
    st, _ = raw.session(
        [
            (c.OP_PUTROOTFH, None),
            (c.OP_LOOKUP, "export"),
            (c.OP_LOOKUP, "secret"),
            (c.OP_SETATTR, t.ARGS[c.OP_SETATTR](stateid(0, b"\0" * 12), value)),
        ]
    )
    return st


def test_owners_are_names_under_kerberos_and_numbers_under_auth_sys(gss_server, kdc):
    raw = client(gss_server, kdc, service=SVC_INTEGRITY).setup()
    try:
        assert _owners(raw, "export") == (f"daemon@{DOMAIN}", f"daemon@{DOMAIN}")
        assert _set_owner(raw, f"daemon@{DOMAIN}") == 0  # its own name: allowed
        assert _set_owner(raw, "1") == 0  # a numeric id still is
        assert _set_owner(raw, f"no-such-user@{DOMAIN}") == c.NFS4ERR_BADOWNER
        assert _set_owner(raw, "daemon@elsewhere.example") == c.NFS4ERR_BADOWNER
        assert _set_owner(raw, "root") == c.NFS4ERR_PERM  # a real name, not daemon's to give
    finally:
        raw.close()
    sys_client = RawClient(gss_server.port).setup()
    try:
        assert _owners(sys_client, "open") == ("1", "1")
    finally:
        sys_client.close()


def test_nfsv40_and_mount_under_privacy(gss_server, kdc):
    raw = client(gss_server, kdc, service=SVC_PRIVACY)
    try:
        fh, flavors = _mnt(raw, "/export")  # MOUNT itself under krb5p
        assert flavors == [390005, 390004, 390003]
        raw.setup40()
        st, res = raw.v40(
            [
                (c.OP_PUTROOTFH, None),
                (c.OP_LOOKUP, "export"),
                (c.OP_LOOKUP, "secret"),
                (c.OP_READ, t.ARGS[c.OP_READ](stateid(0, b"\0" * 12), 0, 4096)),
            ]
        )
        assert st == 0 and res[-1][2].data == SECRET, res
    finally:
        raw.close()


def _reads(raw) -> dict[str, int]:
    """The status of reading each file through each Kerberos export."""
    return {
        f"{export}/{name}": read_secret(raw, export, name)[0]
        for export in ("export", "machines")
        for name in ("secret", "for-anon")
    }


def test_machine_principals_are_mapped_as_knfsd_maps_them(gss_server, kdc, tmp_path):
    """The client's machine principal (what the Linux client's state operations and root's
    accesses use) makes and keeps its client record, and reads as each export's anonymous
    identity; a krb5.conf auth_to_local rule mapping it to root gets root where the export
    does not squash it, and still the anonymous identity where it does."""
    machine = f"nfs/{MACHINE}"
    raw = client(gss_server, kdc, user=machine)
    try:
        raw.setup(owner=b"machine-owner")  # EXCHANGE_ID, CREATE_SESSION, RECLAIM_COMPLETE
        assert _reads(raw) == {
            "export/secret": c.NFS4ERR_ACCESS,
            "export/for-anon": c.NFS4ERR_ACCESS,  # /export's anonymous group is 65534
            "machines/secret": c.NFS4ERR_ACCESS,
            "machines/for-anon": 0,  # /machines's is 4242
        }
        shown = nfs_clients.list_clients(gss_server.server.catalog)
        assert f"krb5 {machine}@{kdc.realm} (no local user)" in [cl["principal"] for cl in shown]
    finally:
        raw.close()
    # another unmapped principal (same anonymous uid) may not take over the machine's record
    ghost = client(gss_server, kdc, user="ghost")
    try:
        update = c.EXCHGID4_FLAG_UPD_CONFIRMED_REC_A
        args = t.ARGS[c.OP_EXCHANGE_ID](b"v" * 8, b"machine-owner", update, (c.SP4_NONE, None), [])
        st, _ = ghost.compound([(c.OP_EXCHANGE_ID, args)])
        assert st == c.NFS4ERR_PERM
    finally:
        ghost.close()
    # the admin maps nfs/* machine principals to root (as with gssproxy and knfsd)
    conf = tmp_path / "krb5.conf"
    rule = f"    auth_to_local = RULE:[2:$1@$0](nfs@{kdc.realm})s/.*/root/\n"
    conf.write_text(
        kdc.krb5_conf_text().replace(
            f"  {kdc.realm} = {{\n", f"  {kdc.realm} = {{\n{rule}    auth_to_local = DEFAULT\n"
        )
    )
    saved = os.environ["KRB5_CONFIG"]
    os.environ["KRB5_CONFIG"] = str(conf)
    try:
        raw = client(gss_server, kdc, user=machine)
        raw.setup()
        assert _reads(raw) == {
            "export/secret": c.NFS4ERR_ACCESS,  # root, squashed: never more than the export grants
            "export/for-anon": c.NFS4ERR_ACCESS,
            "machines/secret": 0,  # root, not squashed
            "machines/for-anon": 0,
        }
        raw.close()
    finally:
        os.environ["KRB5_CONFIG"] = saved
