"""The Linux kernel NFS client against `shingle serve`: each check the guest ran in the
session's VM (conftest.kernel_nfs_results) is one test, named VERSION/USER/CHECK,
VERSION/CHECK, or docs/EXAMPLE for an example of docs/clients.md run over the mount."""

from __future__ import annotations

import pytest
from guest_nfs import planned_checks
from nfs_rig import (
    KNOWN_FAILURES,
    KRB5_TIMEOUT_S,
    NOT_IMPLEMENTED,
    VM_TIMEOUT_S,
    krb5_plan,
    plan_for,
    root_squash_plan,
)


def _params() -> list:
    params = []
    for name in planned_checks(plan_for(0)):
        reason = NOT_IMPLEMENTED.get(name.split("/")[0]) or KNOWN_FAILURES.get(name)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(name, id=name, marks=marks))
    return params


# the first check waits for the whole VM run (VM_TIMEOUT_S) in its fixture's setup
@pytest.mark.timeout(VM_TIMEOUT_S + 300)
@pytest.mark.parametrize("check", _params())
def test_kernel_client(kernel_nfs_results, check):
    verdict, details = kernel_nfs_results.outcome(check)
    if verdict == "SKIP":
        pytest.skip(f"{check}: {details}")
    assert verdict == "PASS", f"{check}: {details}"


@pytest.mark.timeout(VM_TIMEOUT_S + 300)  # the main VM run, should these tests come first
@pytest.mark.parametrize(
    "check", planned_checks({"versions": [], "uids": [], **root_squash_plan(0)})
)
def test_kernel_client_root_squash(root_squash_results, check):
    """A root client with the default squash keeps its own files and gains nothing over
    other users' files or the export root (invariant 12); in the main VM boot."""
    verdict, details = root_squash_results.outcome(check)
    assert verdict == "PASS", f"{check}: {details}"


@pytest.mark.timeout(KRB5_TIMEOUT_S + 300)
@pytest.mark.parametrize("check", planned_checks(krb5_plan(0)))
def test_kernel_client_krb5(krb5_results, check):
    """sec=krb5, krb5i and krb5p mounts (v4.1, v3) through rpc.gssd: a user with a ticket writes,
    renames and reads back; one without gets EACCES; root (the machine key) writes as the
    anonymous user of the root-squashed export; sec=sys of the krb5-only export is refused."""
    verdict, details = krb5_results.outcome(check)
    assert verdict == "PASS", f"{check}: {details}"
