"""The client side of RPCSEC_GSS (RFC 2203) over the raw test client: a Kerberos context made
with the python-gssapi initiator (a user's key from the test KDC's keytab, no kinit), then calls
under krb5, krb5i or krb5p whose verifiers and wrapped results it checks itself."""

from __future__ import annotations

import struct

import gssapi
from nfs4_rawclient import RawClient

from appliance.nfs.v4 import const as c

RPCSEC_GSS = 6
PROC_DATA, PROC_INIT, PROC_CONTINUE_INIT, PROC_DESTROY = range(4)
SVC_NONE, SVC_INTEGRITY, SVC_PRIVACY = 1, 2, 3
MSG_DENIED = 1


def opaque(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data + b"\0" * (-len(data) % 4)


def read_opaque(buf: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from(">I", buf, pos)
    return buf[pos + 4 : pos + 4 + n], pos + 4 + n + (-n % 4)


class Denied(Exception):
    def __init__(self, auth_stat: int):
        super().__init__(f"MSG_DENIED, auth_stat {auth_stat}")
        self.auth_stat = auth_stat


class GssRawClient(RawClient):
    """RawClient whose calls go under RPCSEC_GSS; ``service`` may change between calls."""

    def __init__(self, port: int, principal: str, keytab, target: str, service=SVC_NONE):
        super().__init__(port)
        self.service = service
        self.gss_seq = 0
        self.last_seq = 0
        name = gssapi.Name(principal, gssapi.NameType.kerberos_principal)
        creds = gssapi.Credentials(
            name=name,
            usage="initiate",
            store={"client_keytab": str(keytab), "ccache": f"MEMORY:{principal}"},
        )
        self.ctx = gssapi.SecurityContext(
            name=gssapi.Name(target, gssapi.NameType.hostbased_service),
            creds=creds,
            usage="initiate",
            flags=gssapi.RequirementFlag.mutual_authentication,
        )
        self.handle = b""
        self.window = 0

    # -- context ---------------------------------------------------------------------------
    def establish(self, prog=c.NFS4_PROGRAM, vers=4) -> None:
        token = self.ctx.step()
        gproc = PROC_INIT
        while True:
            reply = self._send(0, opaque(token), prog, vers, gproc, 0, SVC_NONE, verf=None)
            vflavor, verf, pos, accept = self._accepted_head(reply)
            assert accept == 0, f"accept_stat {accept}"
            handle, pos = read_opaque(reply, pos)
            major, minor, window = struct.unpack_from(">III", reply, pos)
            server_token, _ = read_opaque(reply, pos + 12)
            assert major in (0, 1), f"GSS major {major:#x} minor {minor}"
            if server_token:
                self.ctx.step(server_token)
            self.handle = handle
            if major == 0:
                assert vflavor == RPCSEC_GSS
                self.ctx.verify_signature(struct.pack(">I", window), verf)  # raises if forged
                self.window = window
                return
            gproc, token = PROC_CONTINUE_INIT, b""

    def destroy(self, prog=c.NFS4_PROGRAM, vers=4) -> bytes:
        return self.gss_call(0, b"", prog, vers, gproc=PROC_DESTROY)

    # -- calls -------------------------------------------------------------------------------
    def call_raw(self, proc, body, prog=c.NFS4_PROGRAM, vers=4, flavor=None, cred=None) -> bytes:
        """The reply with its results unwrapped and its verifier checked (what RawClient.parse
        reads); raises Denied for an MSG_DENIED reply."""
        return self.gss_call(proc, body, prog, vers)

    def gss_call(self, proc, body, prog=c.NFS4_PROGRAM, vers=4, gproc=PROC_DATA, seq=None):
        self.send_gss(proc, body, prog, vers, gproc, seq)
        return self.receive_gss()

    def send_gss(
        self,
        proc,
        body,
        prog=c.NFS4_PROGRAM,
        vers=4,
        gproc=PROC_DATA,
        seq=None,
        forge_mic=False,
        forge_args=False,
    ):
        if seq is None:
            self.gss_seq += 1
            seq = self.gss_seq
        self.last_seq = seq
        service = self.service
        if service != SVC_NONE:
            data = struct.pack(">I", seq) + body
            if service == SVC_INTEGRITY:
                mic = self.ctx.get_signature(data)
                if forge_args:
                    data = data[:-1] + bytes([data[-1] ^ 1]) if body else data + b"\0\0\0\0"
                body = opaque(data) + opaque(mic)
            else:
                body = opaque(self.ctx.wrap(data, True).message)
        self._send_only(proc, body, prog, vers, gproc, seq, service, verf="mic", forge=forge_mic)

    def receive_gss(self) -> bytes:
        reply = self.recv_record()
        vflavor, verf, pos, accept = self._accepted_head(reply)
        assert vflavor == RPCSEC_GSS, vflavor
        self.ctx.verify_signature(struct.pack(">I", self.last_seq), verf)
        head, results = reply[:pos], reply[pos:]
        if accept != 0 or self.service == SVC_NONE:
            return reply
        if self.service == SVC_INTEGRITY:
            data, p2 = read_opaque(results, 0)
            mic, _ = read_opaque(results, p2)
            self.ctx.verify_signature(data, mic)
        else:
            wrapped, _ = read_opaque(results, 0)
            unwrapped = self.ctx.unwrap(wrapped)
            assert unwrapped.encrypted
            data = unwrapped.message
        assert struct.unpack_from(">I", data, 0)[0] == self.last_seq
        return head + data[4:]

    # -- wire ---------------------------------------------------------------------------------
    def _send(self, proc, body, prog, vers, gproc, seq, service, verf):
        self._send_only(proc, body, prog, vers, gproc, seq, service, verf)
        return self.recv_record()

    def _send_only(self, proc, body, prog, vers, gproc, seq, service, verf, forge=False):
        self.xid += 1
        cred = struct.pack(">IIII", 1, gproc, seq, service) + opaque(self.handle)
        head = struct.pack(">IIIIII", self.xid, 0, 2, prog, vers, proc)
        head += struct.pack(">I", RPCSEC_GSS) + opaque(cred)
        if verf is None:
            head += struct.pack(">II", 0, 0)
        else:
            mic = self.ctx.get_signature(head)
            if forge:
                mic = mic[:-1] + bytes([mic[-1] ^ 0xFF])
            head += struct.pack(">I", RPCSEC_GSS) + opaque(mic)
        self.send_record(head + body)

    @staticmethod
    def _accepted_head(reply: bytes):
        """(verifier flavour, verifier body, offset of the results, accept_stat) of an accepted
        reply; Denied for a denial."""
        _xid, _mtype, stat = struct.unpack_from(">III", reply, 0)
        if stat == MSG_DENIED:
            raise Denied(struct.unpack_from(">I", reply, 16)[0])
        vflavor = struct.unpack_from(">I", reply, 12)[0]
        verf, pos = read_opaque(reply, 16)
        accept = struct.unpack_from(">I", reply, pos)[0]
        return vflavor, verf, pos + 4, accept
