"""A storage host whose link goes down while nothing is asked of it: no RST comes, no request
times out, so only TCP keepalive (engine/drives/remote.py KEEPALIVE_S) finds it gone. On the
test bed: an agent in a host of its own, a head's RemoteDrive in another, the agent's link cut
(the bridge's end of its veth down), then restored."""

from __future__ import annotations

import os
import sys
import time

from agenthelpers import REPO, SERVING

from engine.drives.remote import KEEPALIVE_S, RemoteDrive, hello

PORT = 7400


def test_an_idle_agent_whose_link_goes_down_is_not_present_within_the_keepalive(healed_bed):
    bed = healed_bed
    agent_host = bed.add_host("linkagent")
    bed.add_host("linkhead")
    address = f"{agent_host.address}:{PORT}"
    log = agent_host.folder / "agent.log"
    with open(log, "ab") as out:
        agent = bed.run(
            "linkagent",
            [sys.executable, "-m", "appliance.cli", "agent", "--listen", address,
             "--host", "linkagent", "--format", "--drive-size", "16MiB", "--zone-size", "1MiB",
             "--no-preallocate", "--drives", str(agent_host.folder / "d0")],
            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out, stderr=out, cwd=REPO,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while SERVING not in log.read_text(errors="replace"):
            assert agent.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        served = bed.call("linkhead", lambda: hello(address))["drives"][0]
        # made and asked from inside the head's namespace only (the threads it starts stay
        # there): the bed's addresses mean nothing outside it
        drive = bed.call(
            "linkhead",
            lambda: RemoteDrive(address, served["uuid"], served["zone_size"], served["zone_count"]),
        )
        try:
            assert bed.call("linkhead", lambda: drive.write_pointer(0)) == 0
            assert bed.call("linkhead", drive.present)
            bed.cut_link("linkagent")
            cut = time.monotonic()
            while bed.call("linkhead", drive.present):  # idle: only keepalive can tell
                assert time.monotonic() - cut < KEEPALIVE_S + 15, "still present"
                time.sleep(0.2)
            noticed = time.monotonic() - cut
            print(f"\nidle agent's link cut: not present after {noticed:.1f} s")
            assert noticed >= 4  # not by a request: there was none
            bed.restore_link("linkagent")
            back = time.monotonic() + 30
            while not bed.call("linkhead", drive.present):  # reconnects from the namespace
                assert time.monotonic() < back, "not back after the link returned"
                time.sleep(0.2)
            assert bed.call("linkhead", lambda: drive.write_pointer(0)) == 0
        finally:
            drive.close()
    finally:
        agent.kill()
        agent.wait()
