"""NLM v4 (program 100021, X/Open XNFS chapter 10 / the nlm4 protocol) and NSM
(program 100024, the status monitor) XDR declarations and protocol numbers.
``NLM_ARGS``/``NLM_RESULTS`` and ``NSM_ARGS``/``NSM_RESULTS`` map each procedure
to its declared argument and result type."""

from __future__ import annotations

from appliance.nfs.onc.xdr import (
    Bool,
    Enum,
    FixedOpaque,
    Int,
    Opaque,
    String,
    Struct,
    UHyper,
    Union,
    Void,
)

NLM_PROGRAM = 100021
NLM_V4 = 4
NSM_PROGRAM = 100024
NSM_V1 = 1

LM_MAXSTRLEN = 1024
MAXNETOBJ_SZ = 1024
SM_MAXSTRLEN = 1024

# -- NLM v4 procedures ---------------------------------------------------------------------
NLMPROC4_NULL, NLMPROC4_TEST, NLMPROC4_LOCK, NLMPROC4_CANCEL, NLMPROC4_UNLOCK = range(5)
NLMPROC4_GRANTED = 5
(
    NLMPROC4_TEST_MSG,
    NLMPROC4_LOCK_MSG,
    NLMPROC4_CANCEL_MSG,
    NLMPROC4_UNLOCK_MSG,
    NLMPROC4_GRANTED_MSG,
) = range(6, 11)
(
    NLMPROC4_TEST_RES,
    NLMPROC4_LOCK_RES,
    NLMPROC4_CANCEL_RES,
    NLMPROC4_UNLOCK_RES,
    NLMPROC4_GRANTED_RES,
) = range(11, 16)
NLMPROC4_SHARE, NLMPROC4_UNSHARE, NLMPROC4_NM_LOCK, NLMPROC4_FREE_ALL = 20, 21, 22, 23
NLM_PROC_NAMES = {v: k[9:].lower() for k, v in globals().items() if k.startswith("NLMPROC4_")}

# nlm4_stats
NLM4_GRANTED, NLM4_DENIED, NLM4_DENIED_NOLOCKS, NLM4_BLOCKED = 0, 1, 2, 3
NLM4_DENIED_GRACE_PERIOD, NLM4_DEADLCK, NLM4_ROFS, NLM4_STALE_FH = 4, 5, 6, 7
NLM4_FBIG, NLM4_FAILED = 8, 9

# fsh4_mode (deny) and fsh4_access of NLM_SHARE
FSM_DN, FSM_DR, FSM_DW, FSM_DRW = range(4)
FSA_NONE, FSA_R, FSA_W, FSA_RW = range(4)

netobj = Opaque(MAXNETOBJ_SZ, "netobj")
nlm4_stats = Enum("nlm4_stats")
nlm4_holder = Struct(
    "nlm4_holder",
    ("exclusive", Bool),
    ("svid", Int),
    ("oh", netobj),
    ("l_offset", UHyper),
    ("l_len", UHyper),
)
nlm4_testrply = Union("nlm4_testrply", nlm4_stats, {NLM4_DENIED: nlm4_holder}, default=Void)
nlm4_res = Struct("nlm4_res", ("cookie", netobj), ("stat", nlm4_stats))
nlm4_testres = Struct("nlm4_testres", ("cookie", netobj), ("stat", nlm4_testrply))
nlm4_lock = Struct(
    "nlm4_lock",
    ("caller_name", String(LM_MAXSTRLEN)),
    ("fh", netobj),
    ("oh", netobj),
    ("svid", Int),
    ("l_offset", UHyper),
    ("l_len", UHyper),
)
nlm4_lockargs = Struct(
    "nlm4_lockargs",
    ("cookie", netobj),
    ("block", Bool),
    ("exclusive", Bool),
    ("alock", nlm4_lock),
    ("reclaim", Bool),
    ("state", Int),
)
nlm4_cancargs = Struct(
    "nlm4_cancargs", ("cookie", netobj), ("block", Bool), ("exclusive", Bool), ("alock", nlm4_lock)
)
nlm4_testargs = Struct(
    "nlm4_testargs", ("cookie", netobj), ("exclusive", Bool), ("alock", nlm4_lock)
)
nlm4_unlockargs = Struct("nlm4_unlockargs", ("cookie", netobj), ("alock", nlm4_lock))
nlm4_share = Struct(
    "nlm4_share",
    ("caller_name", String(LM_MAXSTRLEN)),
    ("fh", netobj),
    ("oh", netobj),
    ("mode", Enum("fsh4_mode", range(4))),
    ("access", Enum("fsh4_access", range(4))),
)
nlm4_shareargs = Struct(
    "nlm4_shareargs", ("cookie", netobj), ("share", nlm4_share), ("reclaim", Bool)
)
nlm4_shareres = Struct("nlm4_shareres", ("cookie", netobj), ("stat", nlm4_stats), ("sequence", Int))
nlm4_notify = Struct("nlm4_notify", ("name", String(LM_MAXSTRLEN)), ("state", Int))

NLM_ARGS = {
    NLMPROC4_NULL: Void,
    NLMPROC4_TEST: nlm4_testargs,
    NLMPROC4_LOCK: nlm4_lockargs,
    NLMPROC4_CANCEL: nlm4_cancargs,
    NLMPROC4_UNLOCK: nlm4_unlockargs,
    NLMPROC4_GRANTED: nlm4_testargs,
    NLMPROC4_TEST_MSG: nlm4_testargs,
    NLMPROC4_LOCK_MSG: nlm4_lockargs,
    NLMPROC4_CANCEL_MSG: nlm4_cancargs,
    NLMPROC4_UNLOCK_MSG: nlm4_unlockargs,
    NLMPROC4_GRANTED_MSG: nlm4_testargs,
    NLMPROC4_TEST_RES: nlm4_testres,
    NLMPROC4_LOCK_RES: nlm4_res,
    NLMPROC4_CANCEL_RES: nlm4_res,
    NLMPROC4_UNLOCK_RES: nlm4_res,
    NLMPROC4_GRANTED_RES: nlm4_res,
    NLMPROC4_SHARE: nlm4_shareargs,
    NLMPROC4_UNSHARE: nlm4_shareargs,
    NLMPROC4_NM_LOCK: nlm4_lockargs,
    NLMPROC4_FREE_ALL: nlm4_notify,
}
NLM_RESULTS = {
    NLMPROC4_NULL: Void,
    NLMPROC4_TEST: nlm4_testres,
    NLMPROC4_LOCK: nlm4_res,
    NLMPROC4_CANCEL: nlm4_res,
    NLMPROC4_UNLOCK: nlm4_res,
    NLMPROC4_GRANTED: nlm4_res,
    NLMPROC4_SHARE: nlm4_shareres,
    NLMPROC4_UNSHARE: nlm4_shareres,
    NLMPROC4_NM_LOCK: nlm4_res,
    **{proc: Void for proc in range(NLMPROC4_TEST_MSG, NLMPROC4_GRANTED_RES + 1)},
    NLMPROC4_FREE_ALL: Void,
}
# each asynchronous request and the procedure its answer is sent back with
MSG_TO_SYNC = {
    NLMPROC4_TEST_MSG: NLMPROC4_TEST,
    NLMPROC4_LOCK_MSG: NLMPROC4_LOCK,
    NLMPROC4_CANCEL_MSG: NLMPROC4_CANCEL,
    NLMPROC4_UNLOCK_MSG: NLMPROC4_UNLOCK,
    NLMPROC4_GRANTED_MSG: NLMPROC4_GRANTED,
}
MSG_TO_RES = {
    NLMPROC4_TEST_MSG: NLMPROC4_TEST_RES,
    NLMPROC4_LOCK_MSG: NLMPROC4_LOCK_RES,
    NLMPROC4_CANCEL_MSG: NLMPROC4_CANCEL_RES,
    NLMPROC4_UNLOCK_MSG: NLMPROC4_UNLOCK_RES,
    NLMPROC4_GRANTED_MSG: NLMPROC4_GRANTED_RES,
}

# -- NSM ---------------------------------------------------------------------------------------
SM_NULL, SM_STAT, SM_MON, SM_UNMON, SM_UNMON_ALL, SM_SIMU_CRASH, SM_NOTIFY = range(7)
STAT_SUCC, STAT_FAIL = 0, 1

sm_name = Struct("sm_name", ("mon_name", String(SM_MAXSTRLEN)))
sm_stat_res = Struct(
    "sm_stat_res", ("res_stat", Enum("res", (STAT_SUCC, STAT_FAIL))), ("state", Int)
)
sm_stat = Struct("sm_stat", ("state", Int))
my_id = Struct(
    "my_id", ("my_name", String(SM_MAXSTRLEN)), ("my_prog", Int), ("my_vers", Int), ("my_proc", Int)
)
mon_id = Struct("mon_id", ("mon_name", String(SM_MAXSTRLEN)), ("my_id", my_id))
mon = Struct("mon", ("mon_id", mon_id), ("priv", FixedOpaque(16)))
stat_chge = Struct("stat_chge", ("mon_name", String(SM_MAXSTRLEN)), ("state", Int))

NSM_ARGS = {
    SM_NULL: Void,
    SM_STAT: sm_name,
    SM_MON: mon,
    SM_UNMON: mon_id,
    SM_UNMON_ALL: my_id,
    SM_SIMU_CRASH: Void,
    SM_NOTIFY: stat_chge,
}
NSM_RESULTS = {
    SM_NULL: Void,
    SM_STAT: sm_stat_res,
    SM_MON: sm_stat_res,
    SM_UNMON: sm_stat,
    SM_UNMON_ALL: sm_stat,
    SM_SIMU_CRASH: Void,
    SM_NOTIFY: Void,
}
