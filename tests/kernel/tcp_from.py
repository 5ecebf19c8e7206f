"""A qemu guestfwd command (run on the host, standard library only): qemu's user-mode network
spawns it for each connection the guest makes to the forwarded address, with that connection
on its stdin and stdout; it connects to PORT of the host's 127.0.0.1 from the source address
FROM and relays both ways until either side closes.

    python3 tcp_from.py FROM PORT

Under qemu's user-mode networking every guest connection reaches the host from 127.0.0.1;
this gives some of them another source address, so that `shingle serve --heads N`, which
picks a client's head by its address, sends them to another head."""

from __future__ import annotations

import os
import selectors
import socket
import sys


def main(source: str, port: int) -> int:
    # stderr is the guest's connection too: nothing may be written to it
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    guest = socket.socket(fileno=os.dup(0))
    host = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))
    host.settimeout(None)
    ends = {guest: host, host: guest}
    selector = selectors.DefaultSelector()
    for end in ends:
        selector.register(end, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            end = key.fileobj
            data = end.recv(1 << 16)  # type: ignore[union-attr]
            if not data:
                return 0
            ends[end].sendall(data)  # type: ignore[index]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
