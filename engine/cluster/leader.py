"""The maintenance leader: one host of the cluster, elected through an etcd lease.

Campaign (Patroni's pattern, one decision per round, said in one log line): grant a lease of
``ttl_s`` and create the leader key attached to it if no one holds it (an etcd transaction
comparing the key's create revision with 0). The winner's token is the key's create revision:
etcd's revisions only grow, so each leader's token is above every earlier one's. The others
watch the key and campaign again when it changes (the holder resigned or its lease expired).

Holding office: a keepalive every ``ttl_s / 3``. The lease is taken as held until the send time
of the last keepalive etcd answered plus the TTL it answered, by this host's monotonic clock,
which ends no later than etcd's own count (etcd starts counting when the keepalive arrives). So
``token`` turns None when that moment passes, even while the keepalive thread is stuck on a
paused etcd; ``on_lost`` is called from the thread then. What a leader writes to the catalog
meanwhile is fenced (engine/catalog/fence.py): ``on_elected`` must raise the fence before any
maintenance runs, and a deposed leader cannot commit once its successor has.

Timings: a dead leader's successor takes office within ``ttl_s`` plus a watch round trip
(bench/fencing.py measures it); etcd refuses TTLs under about 1.5 s (its election timeout x 1.5).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.base.ratelog import RateLimitedLog
from engine.cluster.etcd import EtcdClient, EtcdError

DEFAULT_KEY = "/shingle/maintenance-leader"
MIN_TTL_S = 2
KEEPALIVES_PER_TTL = 3
WATCH_SLICE_S = 1.0  # a follower's watch is renewed this often (the longest a stop() waits)

log = logging.getLogger("shingle.cluster")
_etcd_trouble = RateLimitedLog(log)


@dataclass(frozen=True)
class LeaderState:
    """What status, the REST API and /metrics say about the election on this host."""

    name: str
    leader: bool
    token: int | None
    leader_name: str | None  # the holder of the key as last seen (None: none, or unknown)
    since: float | None  # time.time() when this host took office

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "leader": self.leader,
            "token": self.token,
            "leader_name": self.leader_name,
            "since": self.since,
        }


class FencedLeader:
    def __init__(
        self,
        client: EtcdClient,
        name: str | None = None,
        *,
        ttl_s: float = 10.0,
        key: str = DEFAULT_KEY,
        on_elected: Callable[[int], bool] | None = None,
        on_lost: Callable[[str], None] | None = None,
        role: str = "maintenance leader",
    ):
        """``on_elected(token)`` runs in the election thread before the token is handed out;
        it returns False (or raises) to step down at once (the fence refused the token).
        ``on_lost(reason)`` runs when office ends, whatever the reason. ``role``: what office
        the log lines name (the same election holds the metadata server's address)."""
        if ttl_s < MIN_TTL_S:
            raise ValueError(f"leader lease TTL {ttl_s} s: expected at least {MIN_TTL_S} s")
        self.client = client
        self.name = name or socket.gethostname()
        self.ttl_s = int(round(ttl_s))
        self.key = key
        self.on_elected = on_elected
        self.on_lost = on_lost
        self.role = role
        self._lease: int | None = None
        self._token: int | None = None
        self._deadline = 0.0  # monotonic: the lease is ours until then
        self._since: float | None = None
        self._seen_leader: str | None = None
        self._step_down_reason: str | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what others read --------------------------------------------------------
    @property
    def token(self) -> int | None:
        """This host's fencing token while it holds office by its own clock, else None."""
        with self._lock:
            if self._token is not None and time.monotonic() < self._deadline:
                return self._token
            return None

    def held_until(self) -> float:
        """The monotonic time office ends unless a keepalive renews it first; 0.0 while this
        host does not hold it (a role tied to office, appliance/mds_address.py, ends what it
        does some margin before)."""
        with self._lock:
            return self._deadline if self._token is not None else 0.0

    def state(self) -> LeaderState:
        token = self.token
        return LeaderState(
            self.name,
            token is not None,
            token,
            self.name if token is not None else self._seen_leader,
            self._since if token is not None else None,
        )

    def wait_elected(self, timeout_s: float) -> int | None:
        """The token once this host holds office, or None after ``timeout_s`` (tests, bench)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            token = self.token
            if token is not None:
                return token
            self._stopped.wait(0.01)
        return self.token

    # -- the thread ----------------------------------------------------------------
    def start(self) -> FencedLeader:
        self._thread = threading.Thread(target=self._run, name="cluster-leader", daemon=True)
        self._thread.start()
        return self

    def stop(self, *, resign: bool = True) -> None:
        """End the thread; ``resign`` revokes the lease, so a successor need not wait its TTL."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        if self._lease is not None:
            self._lose("stopped" + (", resigned" if resign else ""))
            if resign:
                try:
                    self.client.revoke(self._lease)
                except EtcdError as exc:
                    log.warning("cluster: could not resign (the lease expires by itself): %s", exc)
            self._lease = None

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                if self._lease is None:
                    self._campaign()
                else:
                    self._hold()
            except Exception:  # the election must survive anything one round does
                log.exception("cluster: leader election round failed")
                self._stopped.wait(1.0)

    def _campaign(self) -> None:
        sent = time.monotonic()
        try:
            lease = self.client.grant(self.ttl_s)
            won, holder = self.client.create(self.key, self.name, lease.id)
        except EtcdError as exc:
            _etcd_trouble.warning("campaign", "cluster: cannot campaign for leader: %s", exc)
            self._stopped.wait(min(self.ttl_s / KEEPALIVES_PER_TTL, 1.0))
            return
        if won and holder is not None:
            self._take_office(lease.id, holder.create_revision, sent + lease.ttl_s)
            return
        try:
            self.client.revoke(lease.id)
        except EtcdError:
            pass  # it expires by itself within the TTL
        self._seen_leader = holder.value if holder is not None else None
        if holder is None:
            return  # gone between our compare and our read: campaign again now
        log.debug("cluster: no action: %s holds the leader key", holder.value)
        self._watch_key(holder.mod_revision)

    def _watch_key(self, revision: int) -> None:
        """Until the key changes after ``revision`` (then campaign again at once), a TTL passes
        (campaign again anyway) or ``stop()``: watches of at most WATCH_SLICE_S each, from the
        same revision, so a stopping daemon waits no longer than that and no change is missed."""
        end = time.monotonic() + self.ttl_s
        while not self._stopped.is_set() and (left := end - time.monotonic()) > 0:
            started = time.monotonic()
            if self.client.wait_change(self.key, revision, timeout_s=min(left, WATCH_SLICE_S)):
                return
            if time.monotonic() - started < WATCH_SLICE_S / 2:
                # the watch failed at once (a member down): do not hammer etcd
                self._stopped.wait(min(WATCH_SLICE_S, max(end - time.monotonic(), 0)))

    def _take_office(self, lease_id: int, token: int, deadline: float) -> None:
        self._lease = lease_id
        try:
            accepted = self.on_elected(token) if self.on_elected is not None else True
        except Exception as exc:  # noqa: BLE001 - any failure to raise the fence: step down
            log.error("cluster: elected with token %d but could not take office: %s", token, exc)
            accepted = False
        if not accepted:
            log.error(
                "cluster: elected with token %d, but the catalog's fence is past it: stepping down",
                token,
            )
            self._resign_quietly(lease_id)
            self._stopped.wait(self.ttl_s)
            return
        with self._lock:
            self._token, self._deadline, self._since = token, deadline, time.time()
        self._seen_leader = self.name
        log.info("cluster: %s is the %s (token %d)", self.name, self.role, token)

    def _resign_quietly(self, lease_id: int) -> None:
        self._lease = None
        try:
            self.client.revoke(lease_id)
        except EtcdError:
            pass  # it expires by itself within the TTL

    def _hold(self) -> None:
        lease = self._lease
        assert lease is not None
        now = time.monotonic()
        with self._lock:
            deadline = self._deadline
        if now >= deadline:
            reason, self._step_down_reason = self._step_down_reason, None
            self._lose(reason or f"lease not renewed within its {self.ttl_s} s TTL")
            self._resign_quietly(lease)
            return
        sent = now
        try:
            # a request must not outlast the lease: then office ends on time, below
            ttl = self.client.keepalive(lease, timeout_s=min(deadline - now, self.ttl_s / 2))
        except EtcdError as exc:
            _etcd_trouble.warning("keepalive", "cluster: lease keepalive failed: %s", exc)
            self._stopped.wait(min(0.2, max(deadline - time.monotonic(), 0)))
            return
        if ttl <= 0:
            self._lose("etcd no longer has the lease (expired or revoked)")
            self._lease = None
            return
        with self._lock:
            self._deadline = sent + ttl
        if not self._key_is_ours():
            self._lose("the leader key was deleted or replaced in etcd")
            self._resign_quietly(lease)
            return
        self._stopped.wait(self.ttl_s / KEEPALIVES_PER_TTL)

    def _key_is_ours(self) -> bool:
        """Whether the leader key is still the one this host created (an admin may delete it;
        then another host can win it while this lease lives). Unknown counts as ours: the lease
        clock ends office if etcd stays silent."""
        token = self._token
        try:
            key = self.client.get(self.key, timeout_s=self.ttl_s / KEEPALIVES_PER_TTL)
        except EtcdError:
            return True
        return key is not None and key.create_revision == token

    def step_down(self, reason: str) -> None:
        """End office now (the catalog fenced this host's writes: a successor took office, by
        whatever way); the thread resigns the lease and campaigns again."""
        with self._lock:
            if self._token is None:
                return
            self._deadline = 0.0
            self._step_down_reason = reason

    def _lose(self, reason: str) -> None:
        with self._lock:
            held, self._token, self._deadline, self._since = self._token, None, 0.0, None
        if held is None:
            return
        log.warning("cluster: %s is no longer the %s: %s", self.name, self.role, reason)
        self._seen_leader = None
        if self.on_lost is not None:
            try:
                self.on_lost(reason)
            except Exception:  # the election goes on whatever a callback does
                log.exception("cluster: the lost-office callback failed")
