"""Leases (RFC 8881 8.3, RFC 7530 9.5): a client that has not renewed for one lease is
expired, but this server is courteous: its state stays until a request of another client
conflicts with it, and only then does the client go with its state (the rules of records
and the housekeeping are in appliance.nfs.state.clients)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from appliance.nfs.state.core import StateCore
from appliance.nfs.state.model import Client

log = logging.getLogger("shingle.nfs.state")


class Leases:
    def __init__(self, core: StateCore, expire: Callable[[Client], None]):
        self.core = core
        self._expire = expire  # StateTable.expire_client: the client goes with all it holds

    def busy(self, cl: Client) -> bool:
        """Whether a request of ``cl`` is running (a client waiting for its reply renews)."""
        return any(s.busy for sess in cl.sessions.values() for s in sess.slots)

    def lease_over(self, cl: Client) -> bool:
        """Whether ``cl``'s lease ran out (its state stays until something conflicts with it)."""
        return (
            cl.leased
            and time.monotonic() - cl.last_renew > self.core.lease_seconds
            and not self.busy(cl)
        )

    def evict_if_expired(self, cl: Client) -> bool:
        """A request conflicts with ``cl``'s state: if ``cl``'s lease ran out, the courtesy
        ends and the client goes with its state (RFC 8881 8.3); True when it went."""
        if not self.lease_over(cl):
            return False
        log.info(
            "lease of client %x expired: its state goes for a conflicting request", cl.clientid
        )
        self._expire(cl)
        return True
