"""A drive agent's replies to a head that is slow to take them (appliance/agent/server.py): a
reply is never left cut short on an open connection, where the head would wait out its time
limit for bytes that never come (bench/cluster.py's 16 readers through network namespaces met
it). Within the body timeout a slow head gets every reply whole, also while it sends more
requests; a head that takes no reply bytes for longer finds the connection closed."""

from __future__ import annotations

import errno
import os
import socket
import time

from engine.drives import agentwire as wire
from engine.drives.remote import RemoteDrive, hello

ZONE = 1 << 20  # agenthelpers' zones


def stored(agent) -> tuple[bytes, bytes]:
    """A zone of random bytes on the agent's drive; (drive key, the bytes)."""
    drive = hello(agent.address)["drives"][0]
    data = os.urandom(ZONE)
    remote = RemoteDrive(agent.address, drive["uuid"], drive["zone_size"], drive["zone_count"])
    try:
        remote.append(0, 0, data, durable=True)
    finally:
        remote.close()
    return wire.drive_key(drive["uuid"]), data


READS = 8  # 8 MiB of replies: more than the agent's send buffer (at most 4 MiB) can hold


def slow_head(agent) -> socket.socket:
    """A connection whose receive buffer is small: replies of a few MiB fill it and the
    agent's send buffer, and its sender waits until the head reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(20)
    sock.connect(("127.0.0.1", agent.port))
    return sock


def test_a_slow_head_gets_whole_replies_while_it_sends_more_requests(agents):
    (agent,) = agents(1, extra=["--body-timeout", "5"])
    key, data = stored(agent)
    with slow_head(agent) as sock:
        for request_id in range(1, READS + 1):
            wire.send_frame(sock, wire.READ, request_id, wire.READ_FIXED.pack(key, 0, 0, ZONE))
        time.sleep(0.5)  # the replies fill the buffers: the agent's sender waits in its send
        for request_id in (READS + 1, READS + 2):  # read by the agent while it sends
            wire.send_frame(sock, wire.HELLO, request_id)
            time.sleep(0.3)
        for request_id in range(1, READS + 1):
            reply = wire.read_frame(sock)
            assert (reply.request_id, reply.status) == (request_id, 0)
            assert bytes(reply.body) == data
        for request_id in (READS + 1, READS + 2):
            reply = wire.read_frame(sock)
            assert (reply.request_id, reply.status) == (request_id, 0)
            assert reply.op == wire.HELLO | wire.REPLY


def test_a_head_that_takes_no_reply_for_the_body_timeout_finds_the_connection_closed(agents):
    (agent,) = agents(1, extra=["--body-timeout", "1"])
    key, _data = stored(agent)
    with slow_head(agent) as sock:
        for request_id in range(1, READS + 1):
            wire.send_frame(sock, wire.READ, request_id, wire.READ_FIXED.pack(key, 0, 0, ZONE))
        time.sleep(2.5)  # past the agent's limit for a reply to be taken
        received = 0
        started = time.monotonic()
        while True:  # what the agent sent before it gave up, then the end of the connection
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += len(chunk)
        assert received < READS * (wire.HEADER.size + ZONE)  # cut short, and said so by the close
        assert time.monotonic() - started < 10  # not left open for the head to wait out
    # the agent serves on: a new connection reads the zone
    with socket.create_connection(("127.0.0.1", agent.port), timeout=20) as sock:
        wire.send_frame(sock, wire.READ, 2, wire.READ_FIXED.pack(key, 0, 0, 4096))
        reply = wire.read_frame(sock)
        assert reply.status == 0 and len(reply.body) == 4096
        wire.send_frame(sock, wire.READ, 3, wire.READ_FIXED.pack(key, 0, ZONE, 1))
        assert wire.read_frame(sock).status in (errno.EIO, errno.EINVAL)
