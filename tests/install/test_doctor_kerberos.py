"""`shingle doctor`'s Kerberos checks against a real MIT KDC (tests/kdcserver.py): the keytab
readable and holding the service key, and the clock against the KDC."""

from __future__ import annotations

import pytest

from appliance.host import doctor
from tests.kdcserver import SERVER_HOST, KdcServer


@pytest.fixture
def kdc():
    server = KdcServer().start()
    yield server
    server.stop()


def test_keytab_principal_and_clock(kdc):
    keytab = str(kdc.server_keytab)
    results = doctor.check_kerberos(keytab, f"nfs@{SERVER_HOST}")
    assert [(r.name, r.status) for r in results] == [("krb5 keytab", "ok"), ("krb5 clock", "ok")]
    assert f"nfs/{SERVER_HOST}@{kdc.realm}" in results[0].detail
    assert results[1].detail == "+0 s from the KDC"  # the same host's clock
    wrong = doctor.check_kerberos(keytab, "nfs@elsewhere")
    assert [r.status for r in wrong] == ["fail"] and "nfs/elsewhere@" in wrong[0].detail
    kdc.add_user("daemon")  # a keytab with a user's key only
    assert doctor.check_kerberos(str(kdc.client_keytab))[0].status == "fail"
    missing = doctor.check_kerberos(str(kdc.dir / "none.keytab"))
    assert missing[0].status == "fail" and "No such file" in missing[0].detail
    kdc.proc.terminate()
    kdc.proc.wait()
    silent = doctor.check_kerberos(keytab)
    assert [r.status for r in silent] == ["ok", "warn"] and "no ticket" in silent[1].detail


def test_clock_offset_from_a_ccache_header():
    header = b"\x05\x04\x00\x0c" + b"\x00\x01\x00\x08" + (-400).to_bytes(4, "big", signed=True)
    assert doctor.ccache_time_offset(header + b"\0\0\0\0") == -400
    assert doctor.ccache_time_offset(b"\x05\x04\x00\x00") is None  # kdc_timesync off
