"""NFSv3 (RFC 1813) and MOUNT v3 (RFC 1813 appendix I) XDR declarations,
plus the protocol numbers both need. ``ARGS3``/``RESULTS3`` map each NFS
procedure to its declared argument and result type; ``MOUNT_ARGS``/
``MOUNT_RESULTS`` do the same for MOUNT."""

from __future__ import annotations

from appliance.nfs.onc.xdr import (
    Array,
    Bool,
    Enum,
    FixedOpaque,
    Int,
    LinkedList,
    Opaque,
    Optional,
    String,
    Struct,
    UHyper,
    UInt,
    Union,
    Void,
)

NFS_PROGRAM = 100003
NFS_V3 = 3
MOUNT_PROGRAM = 100005
MOUNT_V3 = 3

# -- procedures -------------------------------------------------------------------------------
(
    NFSPROC3_NULL,
    NFSPROC3_GETATTR,
    NFSPROC3_SETATTR,
    NFSPROC3_LOOKUP,
    NFSPROC3_ACCESS,
    NFSPROC3_READLINK,
    NFSPROC3_READ,
    NFSPROC3_WRITE,
    NFSPROC3_CREATE,
    NFSPROC3_MKDIR,
    NFSPROC3_SYMLINK,
    NFSPROC3_MKNOD,
    NFSPROC3_REMOVE,
    NFSPROC3_RMDIR,
    NFSPROC3_RENAME,
    NFSPROC3_LINK,
    NFSPROC3_READDIR,
    NFSPROC3_READDIRPLUS,
    NFSPROC3_FSSTAT,
    NFSPROC3_FSINFO,
    NFSPROC3_PATHCONF,
    NFSPROC3_COMMIT,
) = range(22)
PROC3_NAMES = {v: k[9:] for k, v in globals().items() if k.startswith("NFSPROC3_")}
(
    MOUNTPROC3_NULL,
    MOUNTPROC3_MNT,
    MOUNTPROC3_DUMP,
    MOUNTPROC3_UMNT,
    MOUNTPROC3_UMNTALL,
    MOUNTPROC3_EXPORT,
) = range(6)

# -- status codes (nfsstat3) --------------------------------------------------------------------
NFS3_OK = 0
NFS3ERR_PERM, NFS3ERR_NOENT, NFS3ERR_IO, NFS3ERR_NXIO, NFS3ERR_ACCES = 1, 2, 5, 6, 13
NFS3ERR_EXIST, NFS3ERR_XDEV, NFS3ERR_NODEV, NFS3ERR_NOTDIR, NFS3ERR_ISDIR = 17, 18, 19, 20, 21
NFS3ERR_INVAL, NFS3ERR_FBIG, NFS3ERR_NOSPC, NFS3ERR_ROFS, NFS3ERR_MLINK = 22, 27, 28, 30, 31
NFS3ERR_NAMETOOLONG, NFS3ERR_NOTEMPTY, NFS3ERR_DQUOT = 63, 66, 69
NFS3ERR_STALE, NFS3ERR_REMOTE = 70, 71
NFS3ERR_BADHANDLE, NFS3ERR_NOT_SYNC, NFS3ERR_BAD_COOKIE = 10001, 10002, 10003
NFS3ERR_NOTSUPP = 10004
NFS3ERR_TOOSMALL, NFS3ERR_SERVERFAULT, NFS3ERR_BADTYPE, NFS3ERR_JUKEBOX = 10005, 10006, 10007, 10008

# mountstat3
MNT3_OK, MNT3ERR_PERM, MNT3ERR_NOENT, MNT3ERR_IO, MNT3ERR_ACCES = 0, 1, 2, 5, 13
MNT3ERR_NOTDIR, MNT3ERR_INVAL, MNT3ERR_NAMETOOLONG = 20, 22, 63
MNT3ERR_NOTSUPP, MNT3ERR_SERVERFAULT = 10004, 10006

# ftype3 (the catalog uses the same numbers)
NF3REG, NF3DIR, NF3BLK, NF3CHR, NF3LNK, NF3SOCK, NF3FIFO = range(1, 8)
# ACCESS3 bits
ACCESS3_READ, ACCESS3_LOOKUP, ACCESS3_MODIFY = 0x01, 0x02, 0x04
ACCESS3_EXTEND, ACCESS3_DELETE, ACCESS3_EXECUTE = 0x08, 0x10, 0x20
# stable_how
UNSTABLE, DATA_SYNC, FILE_SYNC = 0, 1, 2
# createmode3
UNCHECKED, GUARDED, EXCLUSIVE = 0, 1, 2
# time_how
DONT_CHANGE, SET_TO_SERVER_TIME, SET_TO_CLIENT_TIME = 0, 1, 2
# FSINFO properties
FSF3_LINK, FSF3_SYMLINK, FSF3_HOMOGENEOUS, FSF3_CANSETTIME = 0x1, 0x2, 0x8, 0x10

NFS3_FHSIZE = 64
NFS3_COOKIEVERFSIZE = NFS3_CREATEVERFSIZE = NFS3_WRITEVERFSIZE = 8
MNTPATHLEN, MNTNAMLEN = 1024, 255
AUTH_NONE, AUTH_SYS = 0, 1

# -- basic types ----------------------------------------------------------------------------------
nfsstat3 = Enum("nfsstat3")
ftype3 = Enum("ftype3", range(1, 8))
nfs_fh3 = Opaque(NFS3_FHSIZE, "nfs_fh3")
filename3 = String(None, "filename3")  # the namespace enforces NAME_MAX with a clear error
nfspath3 = String(None, "nfspath3")
cookieverf3 = FixedOpaque(NFS3_COOKIEVERFSIZE, "cookieverf3")
createverf3 = FixedOpaque(NFS3_CREATEVERFSIZE, "createverf3")
writeverf3 = FixedOpaque(NFS3_WRITEVERFSIZE, "writeverf3")
stable_how = Enum("stable_how", (UNSTABLE, DATA_SYNC, FILE_SYNC))

specdata3 = Struct("specdata3", ("specdata1", UInt), ("specdata2", UInt))
nfstime3 = Struct("nfstime3", ("seconds", UInt), ("nseconds", UInt))
fattr3 = Struct(
    "fattr3",
    ("type", ftype3),
    ("mode", UInt),
    ("nlink", UInt),
    ("uid", UInt),
    ("gid", UInt),
    ("size", UHyper),
    ("used", UHyper),
    ("rdev", specdata3),
    ("fsid", UHyper),
    ("fileid", UHyper),
    ("atime", nfstime3),
    ("mtime", nfstime3),
    ("ctime", nfstime3),
)
post_op_attr = Optional(fattr3, "post_op_attr")
wcc_attr = Struct("wcc_attr", ("size", UHyper), ("mtime", nfstime3), ("ctime", nfstime3))
pre_op_attr = Optional(wcc_attr, "pre_op_attr")
wcc_data = Struct("wcc_data", ("before", pre_op_attr), ("after", post_op_attr))
post_op_fh3 = Optional(nfs_fh3, "post_op_fh3")

time_how = Enum("time_how", (DONT_CHANGE, SET_TO_SERVER_TIME, SET_TO_CLIENT_TIME))
set_time = Union(
    "set_time",
    time_how,
    {DONT_CHANGE: Void, SET_TO_SERVER_TIME: Void, SET_TO_CLIENT_TIME: nfstime3},
)
sattr3 = Struct(
    "sattr3",
    ("mode", Optional(UInt, "set_mode3")),
    ("uid", Optional(UInt, "set_uid3")),
    ("gid", Optional(UInt, "set_gid3")),
    ("size", Optional(UHyper, "set_size3")),
    ("atime", set_time),
    ("mtime", set_time),
)
diropargs3 = Struct("diropargs3", ("dir", nfs_fh3), ("name", filename3))
NO_ATTRS = sattr3.cls(None, None, None, None, (DONT_CHANGE, None), (DONT_CHANGE, None))
EMPTY_WCC = wcc_data.cls(None, None)

# -- arguments -------------------------------------------------------------------------------------
SETATTR3args = Struct(
    "SETATTR3args",
    ("object", nfs_fh3),
    ("new_attributes", sattr3),
    ("guard", Optional(nfstime3, "sattrguard3")),
)
ACCESS3args = Struct("ACCESS3args", ("object", nfs_fh3), ("access", UInt))
READ3args = Struct("READ3args", ("file", nfs_fh3), ("offset", UHyper), ("count", UInt))
WRITE3args = Struct(
    "WRITE3args",
    ("file", nfs_fh3),
    ("offset", UHyper),
    ("count", UInt),
    ("stable", stable_how),
    ("data", Opaque(None)),
)
createmode3 = Enum("createmode3", (UNCHECKED, GUARDED, EXCLUSIVE))
createhow3 = Union(
    "createhow3", createmode3, {UNCHECKED: sattr3, GUARDED: sattr3, EXCLUSIVE: createverf3}
)
CREATE3args = Struct("CREATE3args", ("where", diropargs3), ("how", createhow3))
MKDIR3args = Struct("MKDIR3args", ("where", diropargs3), ("attributes", sattr3))
symlinkdata3 = Struct("symlinkdata3", ("symlink_attributes", sattr3), ("symlink_data", nfspath3))
SYMLINK3args = Struct("SYMLINK3args", ("where", diropargs3), ("symlink", symlinkdata3))
devicedata3 = Struct("devicedata3", ("dev_attributes", sattr3), ("spec", specdata3))
mknoddata3 = Union(
    "mknoddata3",
    ftype3,
    {NF3CHR: devicedata3, NF3BLK: devicedata3, NF3SOCK: sattr3, NF3FIFO: sattr3},
    default=Void,
)
MKNOD3args = Struct("MKNOD3args", ("where", diropargs3), ("what", mknoddata3))
RENAME3args = Struct("RENAME3args", ("from_", diropargs3), ("to", diropargs3))
LINK3args = Struct("LINK3args", ("file", nfs_fh3), ("link", diropargs3))
READDIR3args = Struct(
    "READDIR3args",
    ("dir", nfs_fh3),
    ("cookie", UHyper),
    ("cookieverf", cookieverf3),
    ("count", UInt),
)
READDIRPLUS3args = Struct(
    "READDIRPLUS3args",
    ("dir", nfs_fh3),
    ("cookie", UHyper),
    ("cookieverf", cookieverf3),
    ("dircount", UInt),
    ("maxcount", UInt),
)
COMMIT3args = Struct("COMMIT3args", ("file", nfs_fh3), ("offset", UHyper), ("count", UInt))

ARGS3 = {
    NFSPROC3_NULL: Void,
    NFSPROC3_GETATTR: nfs_fh3,
    NFSPROC3_SETATTR: SETATTR3args,
    NFSPROC3_LOOKUP: diropargs3,
    NFSPROC3_ACCESS: ACCESS3args,
    NFSPROC3_READLINK: nfs_fh3,
    NFSPROC3_READ: READ3args,
    NFSPROC3_WRITE: WRITE3args,
    NFSPROC3_CREATE: CREATE3args,
    NFSPROC3_MKDIR: MKDIR3args,
    NFSPROC3_SYMLINK: SYMLINK3args,
    NFSPROC3_MKNOD: MKNOD3args,
    NFSPROC3_REMOVE: diropargs3,
    NFSPROC3_RMDIR: diropargs3,
    NFSPROC3_RENAME: RENAME3args,
    NFSPROC3_LINK: LINK3args,
    NFSPROC3_READDIR: READDIR3args,
    NFSPROC3_READDIRPLUS: READDIRPLUS3args,
    NFSPROC3_FSSTAT: nfs_fh3,
    NFSPROC3_FSINFO: nfs_fh3,
    NFSPROC3_PATHCONF: nfs_fh3,
    NFSPROC3_COMMIT: COMMIT3args,
}

# -- results: union nfsstat3 { NFS3_OK: resok; default: resfail } ----------------------------------
obj_fail = Struct("objfail3", ("obj_attributes", post_op_attr))
wcc_fail = Struct("wccfail3", ("wcc", wcc_data))
LOOKUP3resok = Struct(
    "LOOKUP3resok",
    ("object", nfs_fh3),
    ("obj_attributes", post_op_attr),
    ("dir_attributes", post_op_attr),
)
ACCESS3resok = Struct("ACCESS3resok", ("obj_attributes", post_op_attr), ("access", UInt))
READLINK3resok = Struct("READLINK3resok", ("symlink_attributes", post_op_attr), ("data", nfspath3))
READ3resok = Struct(
    "READ3resok",
    ("file_attributes", post_op_attr),
    ("count", UInt),
    ("eof", Bool),
    ("data", Opaque(None)),
)
WRITE3resok = Struct(
    "WRITE3resok",
    ("file_wcc", wcc_data),
    ("count", UInt),
    ("committed", stable_how),
    ("verf", writeverf3),
)
CREATE3resok = Struct(
    "CREATE3resok", ("obj", post_op_fh3), ("obj_attributes", post_op_attr), ("dir_wcc", wcc_data)
)
RENAME3res_body = Struct("RENAME3wcc", ("fromdir_wcc", wcc_data), ("todir_wcc", wcc_data))
LINK3res_body = Struct("LINK3wcc", ("file_attributes", post_op_attr), ("linkdir_wcc", wcc_data))
entry3 = Struct("entry3", ("fileid", UHyper), ("name", filename3), ("cookie", UHyper))
READDIR3resok = Struct(
    "READDIR3resok",
    ("dir_attributes", post_op_attr),
    ("cookieverf", cookieverf3),
    ("entries", LinkedList(entry3)),
    ("eof", Bool),
)
entryplus3 = Struct(
    "entryplus3",
    ("fileid", UHyper),
    ("name", filename3),
    ("cookie", UHyper),
    ("name_attributes", post_op_attr),
    ("name_handle", post_op_fh3),
)
READDIRPLUS3resok = Struct(
    "READDIRPLUS3resok",
    ("dir_attributes", post_op_attr),
    ("cookieverf", cookieverf3),
    ("entries", LinkedList(entryplus3)),
    ("eof", Bool),
)
FSSTAT3resok = Struct(
    "FSSTAT3resok",
    ("obj_attributes", post_op_attr),
    ("tbytes", UHyper),
    ("fbytes", UHyper),
    ("abytes", UHyper),
    ("tfiles", UHyper),
    ("ffiles", UHyper),
    ("afiles", UHyper),
    ("invarsec", UInt),
)
FSINFO3resok = Struct(
    "FSINFO3resok",
    ("obj_attributes", post_op_attr),
    ("rtmax", UInt),
    ("rtpref", UInt),
    ("rtmult", UInt),
    ("wtmax", UInt),
    ("wtpref", UInt),
    ("wtmult", UInt),
    ("dtpref", UInt),
    ("maxfilesize", UHyper),
    ("time_delta", nfstime3),
    ("properties", UInt),
)
PATHCONF3resok = Struct(
    "PATHCONF3resok",
    ("obj_attributes", post_op_attr),
    ("linkmax", UInt),
    ("name_max", UInt),
    ("no_trunc", Bool),
    ("chown_restricted", Bool),
    ("case_insensitive", Bool),
    ("case_preserving", Bool),
)
COMMIT3resok = Struct("COMMIT3resok", ("file_wcc", wcc_data), ("verf", writeverf3))


def _res(name, ok, fail):
    return Union(name, nfsstat3, {NFS3_OK: ok}, default=fail)


# procedure -> (result union, the resfail value sent with an error when nothing better is known)
RESULTS3 = {
    NFSPROC3_NULL: (Void, None),
    NFSPROC3_GETATTR: (_res("GETATTR3res", fattr3, Void), None),
    NFSPROC3_SETATTR: (_res("SETATTR3res", wcc_data, wcc_data), EMPTY_WCC),
    NFSPROC3_LOOKUP: (_res("LOOKUP3res", LOOKUP3resok, post_op_attr), None),
    NFSPROC3_ACCESS: (_res("ACCESS3res", ACCESS3resok, post_op_attr), None),
    NFSPROC3_READLINK: (_res("READLINK3res", READLINK3resok, post_op_attr), None),
    NFSPROC3_READ: (_res("READ3res", READ3resok, post_op_attr), None),
    NFSPROC3_WRITE: (_res("WRITE3res", WRITE3resok, wcc_data), EMPTY_WCC),
    NFSPROC3_CREATE: (_res("CREATE3res", CREATE3resok, wcc_data), EMPTY_WCC),
    NFSPROC3_MKDIR: (_res("MKDIR3res", CREATE3resok, wcc_data), EMPTY_WCC),
    NFSPROC3_SYMLINK: (_res("SYMLINK3res", CREATE3resok, wcc_data), EMPTY_WCC),
    NFSPROC3_MKNOD: (_res("MKNOD3res", CREATE3resok, wcc_data), EMPTY_WCC),
    NFSPROC3_REMOVE: (_res("REMOVE3res", wcc_data, wcc_data), EMPTY_WCC),
    NFSPROC3_RMDIR: (_res("RMDIR3res", wcc_data, wcc_data), EMPTY_WCC),
    NFSPROC3_RENAME: (
        _res("RENAME3res", RENAME3res_body, RENAME3res_body),
        RENAME3res_body.cls(EMPTY_WCC, EMPTY_WCC),
    ),
    NFSPROC3_LINK: (
        _res("LINK3res", LINK3res_body, LINK3res_body),
        LINK3res_body.cls(None, EMPTY_WCC),
    ),
    NFSPROC3_READDIR: (_res("READDIR3res", READDIR3resok, post_op_attr), None),
    NFSPROC3_READDIRPLUS: (_res("READDIRPLUS3res", READDIRPLUS3resok, post_op_attr), None),
    NFSPROC3_FSSTAT: (_res("FSSTAT3res", FSSTAT3resok, post_op_attr), None),
    NFSPROC3_FSINFO: (_res("FSINFO3res", FSINFO3resok, post_op_attr), None),
    NFSPROC3_PATHCONF: (_res("PATHCONF3res", PATHCONF3resok, post_op_attr), None),
    NFSPROC3_COMMIT: (_res("COMMIT3res", COMMIT3resok, wcc_data), EMPTY_WCC),
}

# -- MOUNT v3 --------------------------------------------------------------------------------------
dirpath = String(MNTPATHLEN, "dirpath")
mntname = String(MNTNAMLEN, "name")
fhandle3 = Opaque(NFS3_FHSIZE, "fhandle3")
mountstat3 = Enum("mountstat3")
mountres3_ok = Struct("mountres3_ok", ("fhandle", fhandle3), ("auth_flavors", Array(Int)))
mountres3 = Union("mountres3", mountstat3, {MNT3_OK: mountres3_ok}, default=Void)
mountbody = Struct("mountbody", ("ml_hostname", mntname), ("ml_directory", dirpath))
mountlist = LinkedList(mountbody, "mountlist")
exportnode = Struct("exportnode", ("ex_dir", dirpath), ("ex_groups", LinkedList(mntname, "groups")))
exports = LinkedList(exportnode, "exports")

MOUNT_ARGS = {
    MOUNTPROC3_NULL: Void,
    MOUNTPROC3_MNT: dirpath,
    MOUNTPROC3_DUMP: Void,
    MOUNTPROC3_UMNT: dirpath,
    MOUNTPROC3_UMNTALL: Void,
    MOUNTPROC3_EXPORT: Void,
}
MOUNT_RESULTS = {
    MOUNTPROC3_NULL: Void,
    MOUNTPROC3_MNT: mountres3,
    MOUNTPROC3_DUMP: mountlist,
    MOUNTPROC3_UMNT: Void,
    MOUNTPROC3_UMNTALL: Void,
    MOUNTPROC3_EXPORT: exports,
}
