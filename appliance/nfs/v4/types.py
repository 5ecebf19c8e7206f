"""NFSv4.1 XDR declarations (RFC 5662), NFSv4.0's own (RFC 7531) and NFSv4.2's additions
(RFC 7863, extended attributes RFC 8276), once; codecs derive from appliance.nfs.onc.xdr.

``ARGS[op]`` / ``RESULTS[op]`` give each operation's argument and result types.
Operations this server answers with NFS4ERR_NOTSUPP need no argument type:
the COMPOUND stops at the first failing operation."""

from __future__ import annotations

from appliance.nfs.onc.xdr import (
    Array,
    Bool,
    FixedOpaque,
    Hyper,
    LinkedList,
    Opaque,
    String,
    Struct,
    UHyper,
    UInt,
    Union,
    Void,
)
from appliance.nfs.v4 import const as c

NFS4_FHSIZE = 128
NFS4_OPAQUE_LIMIT = 1024

nfsstat4 = UInt
bitmap4 = Array(UInt, 64, "bitmap4")
nfs_fh4 = Opaque(NFS4_FHSIZE, "nfs_fh4")
verifier4 = FixedOpaque(8, "verifier4")
sessionid4 = FixedOpaque(16, "sessionid4")
component4 = String(NFS4_OPAQUE_LIMIT * 4, "component4")
utf8str = String(NFS4_OPAQUE_LIMIT * 4, "utf8str")
linktext4 = Opaque(4096, "linktext4")
sec_oid4 = Opaque(NFS4_OPAQUE_LIMIT, "sec_oid4")

nfstime4 = Struct("nfstime4", ("seconds", Hyper), ("nseconds", UInt))
fsid4 = Struct("fsid4", ("major", UHyper), ("minor", UHyper))
specdata4 = Struct("specdata4", ("specdata1", UInt), ("specdata2", UInt))
stateid4 = Struct("stateid4", ("seqid", UInt), ("other", FixedOpaque(12)))
fattr4 = Struct("fattr4", ("attrmask", bitmap4), ("attr_vals", Opaque(None, "attrlist4")))
change_info4 = Struct("change_info4", ("atomic", Bool), ("before", UHyper), ("after", UHyper))
state_owner4 = Struct("state_owner4", ("clientid", UHyper), ("owner", Opaque(NFS4_OPAQUE_LIMIT)))
settime4 = Union("settime4", UInt, {c.SET_TO_CLIENT_TIME4: nfstime4}, Void)
nfs_impl_id4 = Struct("nfs_impl_id4", ("domain", utf8str), ("name", utf8str), ("date", nfstime4))

# -- RPC credentials used in callbacks / state protection --------------------------------
authsys_parms = Struct(
    "authsys_parms",
    ("stamp", UInt),
    ("machinename", String(255)),
    ("uid", UInt),
    ("gid", UInt),
    ("gids", Array(UInt, 16)),
)
gss_cb_handles4 = Struct(
    "gss_cb_handles4",
    ("service", UInt),
    ("handle_from_server", Opaque()),
    ("handle_from_client", Opaque()),
)
callback_sec_parms4 = Union(
    "callback_sec_parms4",
    UInt,
    {c.AUTH_NONE: Void, c.AUTH_SYS: authsys_parms, c.RPCSEC_GSS: gss_cb_handles4},
)
state_protect_ops4 = Struct(
    "state_protect_ops4", ("must_enforce", bitmap4), ("must_allow", bitmap4)
)
ssv_sp_parms4 = Struct(
    "ssv_sp_parms4",
    ("ops", state_protect_ops4),
    ("hash_algs", Array(sec_oid4)),
    ("encr_algs", Array(sec_oid4)),
    ("window", UInt),
    ("num_gss_handles", UInt),
)
state_protect4_a = Union(
    "state_protect4_a",
    UInt,
    {c.SP4_NONE: Void, c.SP4_MACH_CRED: state_protect_ops4, c.SP4_SSV: ssv_sp_parms4},
)
state_protect4_r = Union(
    "state_protect4_r", UInt, {c.SP4_NONE: Void, c.SP4_MACH_CRED: state_protect_ops4}
)
channel_attrs4 = Struct(
    "channel_attrs4",
    ("headerpadsize", UInt),
    ("maxrequestsize", UInt),
    ("maxresponsesize", UInt),
    ("maxresponsesize_cached", UInt),
    ("maxoperations", UInt),
    ("maxrequests", UInt),
    ("rdma_ird", Array(UInt, 1)),
)

# -- operation arguments -----------------------------------------------------------------
createtype4 = Union(
    "createtype4",
    UInt,
    {
        c.NF4LNK: linktext4,
        c.NF4BLK: specdata4,
        c.NF4CHR: specdata4,
        c.NF4SOCK: Void,
        c.NF4FIFO: Void,
        c.NF4DIR: Void,
    },
    Void,  # RFC 7530 16.4.2: any other type (NF4REG ...) decodes, and CREATE answers BADTYPE
)
open_to_lock_owner4 = Struct(
    "open_to_lock_owner4",
    ("open_seqid", UInt),
    ("open_stateid", stateid4),
    ("lock_seqid", UInt),
    ("lock_owner", state_owner4),
)
exist_lock_owner4 = Struct("exist_lock_owner4", ("lock_stateid", stateid4), ("lock_seqid", UInt))
locker4 = Union("locker4", Bool, {True: open_to_lock_owner4, False: exist_lock_owner4})
creatverfattr = Struct("creatverfattr", ("cva_verf", verifier4), ("cva_attrs", fattr4))
createhow4 = Union(
    "createhow4",
    UInt,
    {
        c.UNCHECKED4: fattr4,
        c.GUARDED4: fattr4,
        c.EXCLUSIVE4: verifier4,
        c.EXCLUSIVE4_1: creatverfattr,
    },
)
openflag4 = Union("openflag4", UInt, {c.OPEN4_CREATE: createhow4, c.OPEN4_NOCREATE: Void})
open_claim_delegate_cur4 = Struct(
    "open_claim_delegate_cur4", ("delegate_stateid", stateid4), ("file", component4)
)
open_claim4 = Union(
    "open_claim4",
    UInt,
    {
        c.CLAIM_NULL: component4,
        c.CLAIM_PREVIOUS: UInt,
        c.CLAIM_DELEGATE_CUR: open_claim_delegate_cur4,
        c.CLAIM_DELEGATE_PREV: component4,
        c.CLAIM_FH: Void,
        c.CLAIM_DELEG_CUR_FH: stateid4,
        c.CLAIM_DELEG_PREV_FH: Void,
    },
)

# -- NFSv4.0 client records (RFC 7530 16.33) ---------------------------------------------
clientaddr4 = Struct(
    "clientaddr4", ("netid", String(NFS4_OPAQUE_LIMIT)), ("addr", String(NFS4_OPAQUE_LIMIT))
)
cb_client4 = Struct("cb_client4", ("cb_program", UInt), ("cb_location", clientaddr4))
nfs_client_id4 = Struct(
    "nfs_client_id4", ("verifier", verifier4), ("id", Opaque(NFS4_OPAQUE_LIMIT))
)

ARGS = {
    c.OP_ACCESS: UInt,
    c.OP_CLOSE: Struct("CLOSE4args", ("seqid", UInt), ("open_stateid", stateid4)),
    c.OP_COMMIT: Struct("COMMIT4args", ("offset", UHyper), ("count", UInt)),
    c.OP_CREATE: Struct(
        "CREATE4args", ("objtype", createtype4), ("objname", component4), ("createattrs", fattr4)
    ),
    c.OP_DELEGPURGE: UHyper,
    c.OP_DELEGRETURN: stateid4,
    c.OP_GETATTR: bitmap4,
    c.OP_GETFH: Void,
    c.OP_LINK: component4,
    c.OP_LOCK: Struct(
        "LOCK4args",
        ("locktype", UInt),
        ("reclaim", Bool),
        ("offset", UHyper),
        ("length", UHyper),
        ("locker", locker4),
    ),
    c.OP_LOCKT: Struct(
        "LOCKT4args",
        ("locktype", UInt),
        ("offset", UHyper),
        ("length", UHyper),
        ("owner", state_owner4),
    ),
    c.OP_LOCKU: Struct(
        "LOCKU4args",
        ("locktype", UInt),
        ("seqid", UInt),
        ("lock_stateid", stateid4),
        ("offset", UHyper),
        ("length", UHyper),
    ),
    c.OP_LOOKUP: component4,
    c.OP_LOOKUPP: Void,
    c.OP_NVERIFY: fattr4,
    c.OP_OPEN: Struct(
        "OPEN4args",
        ("seqid", UInt),
        ("share_access", UInt),
        ("share_deny", UInt),
        ("owner", state_owner4),
        ("openhow", openflag4),
        ("claim", open_claim4),
    ),
    c.OP_OPEN_DOWNGRADE: Struct(
        "OPEN_DOWNGRADE4args",
        ("open_stateid", stateid4),
        ("seqid", UInt),
        ("share_access", UInt),
        ("share_deny", UInt),
    ),
    c.OP_PUTFH: nfs_fh4,
    c.OP_PUTPUBFH: Void,
    c.OP_PUTROOTFH: Void,
    c.OP_READ: Struct("READ4args", ("stateid", stateid4), ("offset", UHyper), ("count", UInt)),
    c.OP_READDIR: Struct(
        "READDIR4args",
        ("cookie", UHyper),
        ("cookieverf", verifier4),
        ("dircount", UInt),
        ("maxcount", UInt),
        ("attr_request", bitmap4),
    ),
    c.OP_READLINK: Void,
    c.OP_REMOVE: component4,
    c.OP_RENAME: Struct("RENAME4args", ("oldname", component4), ("newname", component4)),
    c.OP_RESTOREFH: Void,
    c.OP_SAVEFH: Void,
    c.OP_SECINFO: component4,
    c.OP_SETATTR: Struct("SETATTR4args", ("stateid", stateid4), ("obj_attributes", fattr4)),
    c.OP_VERIFY: fattr4,
    c.OP_WRITE: Struct(
        "WRITE4args",
        ("stateid", stateid4),
        ("offset", UHyper),
        ("stable", UInt),
        ("data", Opaque()),
    ),
    c.OP_BACKCHANNEL_CTL: Struct(
        "BACKCHANNEL_CTL4args", ("cb_program", UInt), ("sec_parms", Array(callback_sec_parms4))
    ),
    c.OP_BIND_CONN_TO_SESSION: Struct(
        "BIND_CONN_TO_SESSION4args",
        ("sessid", sessionid4),
        ("dir", UInt),
        ("use_conn_in_rdma_mode", Bool),
    ),
    c.OP_EXCHANGE_ID: Struct(
        "EXCHANGE_ID4args",
        ("verifier", verifier4),
        ("ownerid", Opaque(NFS4_OPAQUE_LIMIT)),
        ("flags", UInt),
        ("state_protect", state_protect4_a),
        ("client_impl_id", Array(nfs_impl_id4, 1)),
    ),
    c.OP_CREATE_SESSION: Struct(
        "CREATE_SESSION4args",
        ("clientid", UHyper),
        ("sequence", UInt),
        ("flags", UInt),
        ("fore_chan_attrs", channel_attrs4),
        ("back_chan_attrs", channel_attrs4),
        ("cb_program", UInt),
        ("sec_parms", Array(callback_sec_parms4)),
    ),
    c.OP_DESTROY_SESSION: sessionid4,
    c.OP_FREE_STATEID: stateid4,
    c.OP_SECINFO_NO_NAME: UInt,
    c.OP_SEQUENCE: Struct(
        "SEQUENCE4args",
        ("sessionid", sessionid4),
        ("sequenceid", UInt),
        ("slotid", UInt),
        ("highest_slotid", UInt),
        ("cachethis", Bool),
    ),
    c.OP_TEST_STATEID: Array(stateid4, 1024),
    c.OP_DESTROY_CLIENTID: UHyper,
    c.OP_RECLAIM_COMPLETE: Bool,
    # NFSv4.0 only (NFSv4.1 answers them NFS4ERR_NOTSUPP before decoding)
    c.OP_OPEN_CONFIRM: Struct("OPEN_CONFIRM4args", ("open_stateid", stateid4), ("seqid", UInt)),
    c.OP_RENEW: UHyper,
    c.OP_SETCLIENTID: Struct(
        "SETCLIENTID4args",
        ("client", nfs_client_id4),
        ("callback", cb_client4),
        ("callback_ident", UInt),
    ),
    c.OP_SETCLIENTID_CONFIRM: Struct(
        "SETCLIENTID_CONFIRM4args", ("clientid", UHyper), ("setclientid_confirm", verifier4)
    ),
    c.OP_RELEASE_LOCKOWNER: state_owner4,
}

# -- NFSv4.2 (RFC 7863) ------------------------------------------------------------------
netaddr4 = Struct(
    "netaddr4", ("netid", String(NFS4_OPAQUE_LIMIT)), ("addr", String(NFS4_OPAQUE_LIMIT))
)
netloc4 = Union("netloc4", UInt, {c.NL4_NAME: utf8str, c.NL4_URL: utf8str, c.NL4_NETADDR: netaddr4})
xattrkey4 = component4  # RFC 8276: the name without its "user." prefix
xattrvalue4 = Opaque(None, "xattrvalue4")
range_args = (("stateid", stateid4), ("offset", UHyper), ("length", UHyper))
ARGS_42 = {
    c.OP_ALLOCATE: Struct("ALLOCATE4args", *range_args),
    c.OP_DEALLOCATE: Struct("DEALLOCATE4args", *range_args),
    c.OP_COPY: Struct(
        "COPY4args",
        ("src_stateid", stateid4),
        ("dst_stateid", stateid4),
        ("src_offset", UHyper),
        ("dst_offset", UHyper),
        ("count", UHyper),
        ("consecutive", Bool),
        ("synchronous", Bool),
        ("source_server", Array(netloc4)),
    ),
    c.OP_CLONE: Struct(
        "CLONE4args",
        ("src_stateid", stateid4),
        ("dst_stateid", stateid4),
        ("src_offset", UHyper),
        ("dst_offset", UHyper),
        ("count", UHyper),
    ),
    c.OP_OFFLOAD_CANCEL: stateid4,
    c.OP_OFFLOAD_STATUS: stateid4,
    c.OP_READ_PLUS: Struct(
        "READ_PLUS4args", ("stateid", stateid4), ("offset", UHyper), ("count", UInt)
    ),
    c.OP_SEEK: Struct("SEEK4args", ("stateid", stateid4), ("offset", UHyper), ("what", UInt)),
    c.OP_GETXATTR: xattrkey4,
    c.OP_SETXATTR: Struct(
        "SETXATTR4args", ("option", UInt), ("key", xattrkey4), ("value", xattrvalue4)
    ),
    c.OP_LISTXATTRS: Struct("LISTXATTRS4args", ("cookie", UHyper), ("maxcount", UInt)),
    c.OP_REMOVEXATTR: xattrkey4,
}
ARGS.update(ARGS_42)

# -- pNFS (RFC 8881 18.40-18.44) and the FILES layout's bodies (RFC 8881 13.3, 13.2) ----------
deviceid4 = FixedOpaque(c.NFS4_DEVICEID4_SIZE, "deviceid4")
layoutreturn_file4 = Struct(
    "layoutreturn_file4",
    ("offset", UHyper),
    ("length", UHyper),
    ("stateid", stateid4),
    ("body", Opaque()),
)
ARGS.update(
    {
        c.OP_LAYOUTGET: Struct(
            "LAYOUTGET4args",
            ("signal_layout_avail", Bool),
            ("layout_type", UInt),
            ("iomode", UInt),
            ("offset", UHyper),
            ("length", UHyper),
            ("minlength", UHyper),
            ("stateid", stateid4),
            ("maxcount", UInt),
        ),
        c.OP_GETDEVICEINFO: Struct(
            "GETDEVICEINFO4args",
            ("device_id", deviceid4),
            ("layout_type", UInt),
            ("maxcount", UInt),
            ("notify_types", bitmap4),
        ),
        c.OP_LAYOUTRETURN: Struct(
            "LAYOUTRETURN4args",
            ("reclaim", Bool),
            ("layout_type", UInt),
            ("iomode", UInt),
            (
                "layoutreturn",
                Union("layoutreturn4", UInt, {c.LAYOUTRETURN4_FILE: layoutreturn_file4}, Void),
            ),
        ),
        c.OP_LAYOUTCOMMIT: Struct(
            "LAYOUTCOMMIT4args",
            ("offset", UHyper),
            ("length", UHyper),
            ("reclaim", Bool),
            ("stateid", stateid4),
            ("last_write_offset", Union("newoffset4", Bool, {True: UHyper, False: Void})),
            ("time_modify", Union("newtime4", Bool, {True: nfstime4, False: Void})),
            ("layoutupdate", Struct("layoutupdate4", ("type", UInt), ("body", Opaque()))),
        ),
    }
)
nfsv4_1_file_layout4 = Struct(
    "nfsv4_1_file_layout4",
    ("deviceid", deviceid4),
    ("util", UInt),
    ("first_stripe_index", UInt),
    ("pattern_offset", UHyper),
    ("fh_list", Array(nfs_fh4)),
)
nfsv4_1_file_layout_ds_addr4 = Struct(
    "nfsv4_1_file_layout_ds_addr4",
    ("stripe_indices", Array(UInt)),
    ("multipath_ds_list", Array(Array(netaddr4))),
)
layout4 = Struct(
    "layout4",
    ("offset", UHyper),
    ("length", UHyper),
    ("iomode", UInt),
    ("content", Struct("layout_content4", ("type", UInt), ("body", Opaque()))),
)

# -- operation results ----------------------------------------------------------------------------
LOCK4denied = Struct(
    "LOCK4denied",
    ("offset", UHyper),
    ("length", UHyper),
    ("locktype", UInt),
    ("owner", state_owner4),
)
entry4 = Struct("entry4", ("cookie", UHyper), ("name", component4), ("attrs", fattr4))
secinfo4 = Union(
    "secinfo4",
    UInt,
    {c.RPCSEC_GSS: Struct("rpcsec_gss_info", ("oid", sec_oid4), ("qop", UInt), ("service", UInt))},
    Void,
)
# why_no_delegation4: WND4_CONTENTION (1) and WND4_RESOURCE (2) carry a bool
open_none_delegation4 = Union("open_none_delegation4", UInt, {1: Bool, 2: Bool}, Void)
nfsace4 = Struct("nfsace4", ("type", UInt), ("flag", UInt), ("access_mask", UInt), ("who", utf8str))
open_read_delegation4 = Struct(
    "open_read_delegation4", ("stateid", stateid4), ("recall", Bool), ("permissions", nfsace4)
)
nfs_modified_limit4 = Struct("nfs_modified_limit4", ("num_blocks", UInt), ("bytes_per_block", UInt))
nfs_space_limit4 = Union("nfs_space_limit4", UInt, {1: UHyper, 2: nfs_modified_limit4})
open_write_delegation4 = Struct(
    "open_write_delegation4",
    ("stateid", stateid4),
    ("recall", Bool),
    ("space_limit", nfs_space_limit4),
    ("permissions", nfsace4),
)
open_delegation4 = Union(
    "open_delegation4",
    UInt,
    {
        c.OPEN_DELEGATE_NONE: Void,
        c.OPEN_DELEGATE_READ: open_read_delegation4,
        c.OPEN_DELEGATE_WRITE: open_write_delegation4,
        c.OPEN_DELEGATE_NONE_EXT: open_none_delegation4,
    },
)


def result(resok=Void, name: str = "result", /, **other_arms):
    """union switch (nfsstat4 status) { case NFS4_OK: resok; default: void; }"""
    arms = {c.NFS4_OK: resok}
    arms.update({int(k[1:]): v for k, v in other_arms.items()})
    return Union(name, nfsstat4, arms, Void)


STATUS_ONLY = result()
RESULTS = {
    c.OP_ACCESS: result(Struct("ACCESS4resok", ("supported", UInt), ("access", UInt))),
    c.OP_CLOSE: result(stateid4),
    c.OP_COMMIT: result(verifier4),
    c.OP_CREATE: result(Struct("CREATE4resok", ("cinfo", change_info4), ("attrset", bitmap4))),
    c.OP_GETATTR: result(fattr4),
    c.OP_GETFH: result(nfs_fh4),
    c.OP_LINK: result(change_info4),
    c.OP_LOCK: result(stateid4, **{f"_{c.NFS4ERR_DENIED}": LOCK4denied}),
    c.OP_LOCKT: result(Void, **{f"_{c.NFS4ERR_DENIED}": LOCK4denied}),
    c.OP_LOCKU: result(stateid4),
    c.OP_OPEN: result(
        Struct(
            "OPEN4resok",
            ("stateid", stateid4),
            ("cinfo", change_info4),
            ("rflags", UInt),
            ("attrset", bitmap4),
            ("delegation", open_delegation4),
        )
    ),
    c.OP_OPEN_DOWNGRADE: result(stateid4),
    c.OP_READ: result(Struct("READ4resok", ("eof", Bool), ("data", Opaque()))),
    c.OP_READDIR: result(
        Struct(
            "READDIR4resok",
            ("cookieverf", verifier4),
            ("entries", LinkedList(entry4)),
            ("eof", Bool),
        )
    ),
    c.OP_READLINK: result(linktext4),
    c.OP_REMOVE: result(change_info4),
    c.OP_RENAME: result(
        Struct("RENAME4resok", ("source_cinfo", change_info4), ("target_cinfo", change_info4))
    ),
    c.OP_SECINFO: result(Array(secinfo4)),
    c.OP_SECINFO_NO_NAME: result(Array(secinfo4)),
    # SETATTR4res is a struct, not a union: attrsset follows every status
    c.OP_SETATTR: Struct("SETATTR4res", ("status", nfsstat4), ("attrsset", bitmap4)),
    c.OP_WRITE: result(
        Struct("WRITE4resok", ("count", UInt), ("committed", UInt), ("writeverf", verifier4))
    ),
    c.OP_BIND_CONN_TO_SESSION: result(
        Struct(
            "BIND_CONN_TO_SESSION4resok",
            ("sessid", sessionid4),
            ("dir", UInt),
            ("use_conn_in_rdma_mode", Bool),
        )
    ),
    c.OP_EXCHANGE_ID: result(
        Struct(
            "EXCHANGE_ID4resok",
            ("clientid", UHyper),
            ("sequenceid", UInt),
            ("flags", UInt),
            ("state_protect", state_protect4_r),
            ("server_owner_minor", UHyper),
            ("server_owner_major", Opaque(NFS4_OPAQUE_LIMIT)),
            ("server_scope", Opaque(NFS4_OPAQUE_LIMIT)),
            ("server_impl_id", Array(nfs_impl_id4, 1)),
        )
    ),
    c.OP_CREATE_SESSION: result(
        Struct(
            "CREATE_SESSION4resok",
            ("sessionid", sessionid4),
            ("sequence", UInt),
            ("flags", UInt),
            ("fore_chan_attrs", channel_attrs4),
            ("back_chan_attrs", channel_attrs4),
        )
    ),
    c.OP_SEQUENCE: result(
        Struct(
            "SEQUENCE4resok",
            ("sessionid", sessionid4),
            ("sequenceid", UInt),
            ("slotid", UInt),
            ("highest_slotid", UInt),
            ("target_highest_slotid", UInt),
            ("status_flags", UInt),
        )
    ),
    c.OP_TEST_STATEID: result(Array(nfsstat4)),
    c.OP_OPEN_CONFIRM: result(stateid4),
    c.OP_SETCLIENTID: result(
        Struct("SETCLIENTID4resok", ("clientid", UHyper), ("setclientid_confirm", verifier4)),
        **{f"_{c.NFS4ERR_CLID_INUSE}": clientaddr4},
    ),
}

copy_requirements4 = Struct("copy_requirements4", ("consecutive", Bool), ("synchronous", Bool))
write_response4 = Struct(
    "write_response4",
    ("callback_id", Array(stateid4, 1)),
    ("count", UHyper),
    ("committed", UInt),
    ("writeverf", verifier4),
)
read_plus_content = Union(
    "read_plus_content",
    UInt,
    {
        c.NFS4_CONTENT_DATA: Struct("data4", ("offset", UHyper), ("data", Opaque())),
        c.NFS4_CONTENT_HOLE: Struct("data_info4", ("offset", UHyper), ("length", UHyper)),
    },
    Void,
)
RESULTS.update(
    {
        c.OP_LAYOUTGET: result(
            Struct(
                "LAYOUTGET4resok",
                ("return_on_close", Bool),
                ("stateid", stateid4),
                ("layout", Array(layout4)),
            ),
            **{f"_{c.NFS4ERR_LAYOUTTRYLATER}": Bool},
        ),
        c.OP_GETDEVICEINFO: result(
            Struct(
                "GETDEVICEINFO4resok",
                (
                    "device_addr",
                    Struct("device_addr4", ("layout_type", UInt), ("body", Opaque())),
                ),
                ("notification", bitmap4),
            ),
            **{f"_{c.NFS4ERR_TOOSMALL}": UInt},
        ),
        c.OP_LAYOUTRETURN: result(
            Union("layoutreturn_stateid", Bool, {True: stateid4, False: Void})
        ),
        c.OP_LAYOUTCOMMIT: result(Union("newsize4", Bool, {True: UHyper, False: Void})),
    }
)
RESULTS.update(
    {
        c.OP_COPY: result(
            Struct(
                "COPY4resok", ("response", write_response4), ("requirements", copy_requirements4)
            ),
            **{f"_{c.NFS4ERR_OFFLOAD_NO_REQS}": copy_requirements4},
        ),
        c.OP_OFFLOAD_CANCEL: STATUS_ONLY,
        c.OP_OFFLOAD_STATUS: result(
            Struct("OFFLOAD_STATUS4resok", ("count", UHyper), ("complete", Array(nfsstat4, 1)))
        ),
        c.OP_READ_PLUS: result(
            Struct("read_plus_res4", ("eof", Bool), ("contents", Array(read_plus_content)))
        ),
        c.OP_SEEK: result(Struct("seek_res4", ("eof", Bool), ("offset", UHyper))),
        c.OP_GETXATTR: result(xattrvalue4),
        c.OP_SETXATTR: result(change_info4),
        c.OP_LISTXATTRS: result(
            Struct(
                "LISTXATTRS4resok", ("cookie", UHyper), ("names", Array(xattrkey4)), ("eof", Bool)
            )
        ),
        c.OP_REMOVEXATTR: result(change_info4),
    }
)

# The COMPOUND envelope (the op array is decoded one op at a time by the executor).
COMPOUND4args_head = Struct(
    "COMPOUND4args_head", ("tag", Opaque(NFS4_OPAQUE_LIMIT)), ("minorversion", UInt)
)
