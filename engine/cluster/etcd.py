"""A small client of etcd's v3 API through its JSON gateway (no new dependency).

etcd 3.4 (Debian 12's etcd-server) serves its gRPC API as JSON over HTTP under ``/v3/``: keys and
values are base64, 64-bit integers are strings, and a missing field is its zero value (a revoked
lease's keepalive answers no TTL). The PyPI ``etcd3`` package needs an old protobuf and has had
no release since 2020; the five calls the leader election needs are a few lines each here.

Every call tries the endpoints in turn, starting with the one that answered last, and bounds each
attempt by ``timeout_s`` (an etcd member paused or cut off must not hold a caller past its lease).
``EtcdUnavailable`` means no endpoint answered; ``EtcdError`` that one answered with an error.

TLS (https:// endpoints): ``tls_context(ca, cert, key)`` trusts only the cluster's CA and presents
this host's client certificate, as etcd's ``--client-cert-auth`` asks (docs/cluster.md).
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 2.0
# gRPC status codes an etcd member answers while it cannot serve (no leader, shutting down,
# a deadline passed): another member may answer
RETRY_ON_OTHER_MEMBER = {4, 14}  # DEADLINE_EXCEEDED, UNAVAILABLE


class EtcdError(RuntimeError):
    """An etcd member answered with an error."""


class EtcdUnavailable(EtcdError):
    """No etcd endpoint answered in time."""


class EtcdRequestRefused(EtcdError):
    """An etcd member refused the request itself (another member would too)."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: str
    create_revision: int
    mod_revision: int
    lease: int

    @classmethod
    def from_json(cls, kv: dict) -> KeyValue:
        return cls(
            key=_decode(kv["key"]),
            value=_decode(kv.get("value", "")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            lease=int(kv.get("lease", 0)),
        )


@dataclass(frozen=True)
class Lease:
    id: int
    ttl_s: int


def _encode(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _decode(text: str) -> str:
    return base64.b64decode(text).decode(errors="replace")


def tls_context(ca_file: str, cert_file: str = "", key_file: str = "") -> ssl.SSLContext:
    """A client context that trusts only ``ca_file`` (the cluster's CA, not the system's) and
    presents ``cert_file``/``key_file`` when given. Host names are checked against the
    certificates' subject alternative names (the members' addresses)."""
    context = ssl.create_default_context(cafile=ca_file)
    if cert_file:
        context.load_cert_chain(cert_file, key_file or None)
    return context


def check_endpoint(url: str) -> str:
    """``url`` without a trailing slash; ValueError for anything but http(s)://HOST[:PORT]."""
    url = str(url).strip().rstrip("/")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.path:
        raise ValueError(f"etcd endpoint {url!r}: expected http://HOST:PORT")
    return url


class EtcdClient:
    def __init__(
        self,
        endpoints: Iterable[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        tls: ssl.SSLContext | None = None,
    ):
        self.endpoints = [check_endpoint(url) for url in endpoints]
        if not self.endpoints:
            raise ValueError("etcd client: no endpoints given")
        if tls is None and any(url.startswith("https:") for url in self.endpoints):
            raise ValueError("etcd client: https endpoints need the cluster's CA (tls_context)")
        self.timeout_s = timeout_s
        self._first = 0  # the endpoint that answered last is asked first
        # the members are on the cluster's network: never through an http_proxy of the shell
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if tls is not None:
            handlers.append(urllib.request.HTTPSHandler(context=tls))
        self._opener = urllib.request.build_opener(*handlers)

    # -- transport -----------------------------------------------------------
    def _post(self, path: str, body: dict, timeout_s: float | None = None) -> dict:
        timeout = self.timeout_s if timeout_s is None else max(timeout_s, 0.05)
        deadline = time.monotonic() + timeout
        failures = []
        count = len(self.endpoints)
        for step in range(count):
            index = (self._first + step) % count
            url = self.endpoints[index] + path
            left = deadline - time.monotonic()
            if left <= 0:
                failures.append(f"{url}: no time left")
                break
            try:
                # the time left is shared among the endpoints not yet tried: a member that hangs
                # (paused, cut off) must leave the others time to answer
                answer = self._request(url, body, left / (count - step))
            except EtcdError as exc:
                failures.append(str(exc))
                continue
            self._first = index
            return answer
        raise EtcdUnavailable("no etcd endpoint answered: " + "; ".join(failures))

    def _request(self, url: str, body: dict, timeout: float) -> dict:
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            try:
                error = json.loads(exc.read() or b"{}")
            except ValueError:
                error = {}
            message = f"{url}: HTTP {exc.code}: {error.get('error') or exc.reason}"
            if error.get("code") in RETRY_ON_OTHER_MEMBER or exc.code >= 500:
                raise EtcdUnavailable(message) from exc
            raise EtcdRequestRefused(message) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EtcdUnavailable(f"{url}: {reason}") from exc

    # -- leases ----------------------------------------------------------------
    def grant(self, ttl_s: int, *, timeout_s: float | None = None) -> Lease:
        answer = self._post("/v3/lease/grant", {"TTL": int(ttl_s)}, timeout_s)
        if answer.get("error"):
            raise EtcdError(f"lease grant refused: {answer['error']}")
        return Lease(int(answer["ID"]), int(answer.get("TTL", 0)))

    def keepalive(self, lease_id: int, *, timeout_s: float | None = None) -> int:
        """The lease's TTL in seconds after this keepalive; 0 when etcd no longer has it."""
        answer = self._post("/v3/lease/keepalive", {"ID": str(lease_id)}, timeout_s)
        return int(answer.get("result", {}).get("TTL", 0))

    def revoke(self, lease_id: int, *, timeout_s: float | None = None) -> None:
        """Drop the lease and every key attached to it (a lease already gone is no error)."""
        try:
            self._post("/v3/lease/revoke", {"ID": str(lease_id)}, timeout_s)
        except EtcdRequestRefused as exc:
            if "not found" not in str(exc):
                raise

    # -- keys --------------------------------------------------------------------
    def get(self, key: str, *, timeout_s: float | None = None) -> KeyValue | None:
        answer = self._post("/v3/kv/range", {"key": _encode(key)}, timeout_s)
        kvs = answer.get("kvs") or []
        return KeyValue.from_json(kvs[0]) if kvs else None

    def create(
        self, key: str, value: str, lease_id: int, *, timeout_s: float | None = None
    ) -> tuple[bool, KeyValue | None]:
        """Put ``key`` only if it does not exist, attached to the lease: (True, the new key) or
        (False, the key that exists; None if it went away meanwhile)."""
        encoded = _encode(key)
        answer = self._post(
            "/v3/kv/txn",
            {
                "compare": [{"target": "CREATE", "key": encoded, "createRevision": "0"}],
                "success": [
                    {
                        "requestPut": {
                            "key": encoded,
                            "value": _encode(value),
                            "lease": str(lease_id),
                        }
                    }
                ],
                "failure": [{"requestRange": {"key": encoded}}],
            },
            timeout_s,
        )
        if answer.get("succeeded"):
            # the txn holds one put: the key was created at the revision the txn made
            revision = int(answer["header"]["revision"])
            return True, KeyValue(key, value, revision, revision, lease_id)
        ranges = [r["response_range"] for r in answer.get("responses", []) if "response_range" in r]
        kvs = ranges[0].get("kvs") if ranges else None
        return False, KeyValue.from_json(kvs[0]) if kvs else None

    def delete(self, key: str, *, timeout_s: float | None = None) -> None:
        self._post("/v3/kv/deleterange", {"key": _encode(key)}, timeout_s)

    def wait_change(self, key: str, after_revision: int, timeout_s: float) -> bool:
        """Block until ``key`` changes after ``after_revision`` (put or delete) or ``timeout_s``
        passes; True when a change came. A watch on the endpoint that answered last; any failure
        returns False at once (the caller looks again), so a dead member costs no wait."""
        deadline = time.monotonic() + timeout_s
        url = self.endpoints[self._first] + "/v3/watch"
        body = {"create_request": {"key": _encode(key), "start_revision": str(after_revision + 1)}}
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            # the timeout bounds each read: the wait ends within timeout_s of the last line
            with self._opener.open(request, timeout=max(timeout_s, 0.05)) as response:
                while time.monotonic() < deadline:
                    line = response.readline()
                    if not line:
                        return False
                    result = json.loads(line).get("result", {})
                    # canceled: the revision was compacted away; the caller looks again
                    if result.get("events") or result.get("canceled"):
                        return True
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
            return False
        return False

    # -- membership (`shingle cluster add-host` / `remove-host`) -------------------------------
    def members(self, *, timeout_s: float | None = None) -> list[Member]:
        answer = self._post("/v3/cluster/member/list", {}, timeout_s)
        return [Member.from_json(m) for m in answer.get("members", [])]

    def add_member(self, peer_url: str, *, timeout_s: float | None = None) -> Member:
        """etcd's ``member add``: the cluster expects the new member from now on (its quorum
        counts it), so it must be started soon, with initial-cluster-state ``existing``."""
        answer = self._post("/v3/cluster/member/add", {"peerURLs": [peer_url]}, timeout_s)
        return Member.from_json(answer["member"])

    def remove_member(self, member_id: int, *, timeout_s: float | None = None) -> None:
        self._post("/v3/cluster/member/remove", {"ID": str(member_id)}, timeout_s)


@dataclass(frozen=True)
class Member:
    """An etcd cluster member; ``name`` is empty for one added but not started yet."""

    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]

    @classmethod
    def from_json(cls, member: dict) -> Member:
        return cls(
            id=int(member.get("ID", 0)),
            name=member.get("name", ""),
            peer_urls=tuple(member.get("peerURLs", [])),
            client_urls=tuple(member.get("clientURLs", [])),
        )
