"""The SMB page in Debian's chromium (Playwright): add a user with a password, add a share for
them, edit it, change the password, delete both after the confirmation page."""

from __future__ import annotations

from appliance.smb.samba import SambaLayout, SambaPassdb
from engine.admin import events
from engine.admin import smb as smb_service
from tests.webui.conftest import ADMIN, PASSWORD
from tests.webui.helpers import mkdirs
from tests.webui.test_browser import server  # noqa: F401 - fixtures


def test_smb_shares_and_users_in_the_browser(server, page, live):  # noqa: F811
    catalog = live.catalog
    mkdirs(live.namespace, "/projects/team")
    passdb = SambaPassdb(SambaLayout.for_data_dir(live.config.data_dir))

    page.goto(server + "/smb")
    assert page.url.startswith(server + "/login")
    page.fill("input[name=username]", ADMIN)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server + "/smb")
    assert "SMB is not enabled" in page.inner_text("#smb-state")
    page.click("nav a:has-text('SMB')")  # linked in the navigation
    page.wait_for_url(server + "/smb")

    page.fill("#new-user input[name=name]", "dana")
    page.click("#new-user button[type=submit]")  # no password: refused, the name kept
    page.wait_for_load_state()
    assert "password = '': expected a non-empty value" in page.inner_text("#new-user .error")
    assert page.input_value("#new-user input[name=name]") == "dana"
    assert page.get_attribute("#new-user input[name=password]", "type") == "password"
    page.fill("#new-user input[name=password]", "first pw")
    page.click("#new-user button[type=submit]")
    page.wait_for_selector("#smb-users tr[data-user=dana]")
    assert "SMB user dana added (uid 20000, gid 20000)" in page.inner_text(".flash")
    assert passdb.names() == ["dana"]

    form = "#new-share"
    page.fill(f"{form} input[name=name]", "team")
    page.fill(f"{form} input[name=path]", "/projects/missing")
    page.fill(f"{form} input[name=users]", "dana")
    page.click(f"{form} button[type=submit]")
    page.wait_for_load_state()
    assert "path" in page.inner_text(f"{form} .error")
    assert smb_service.list_shares(catalog) == []
    page.fill(f"{form} input[name=path]", "/projects/team")
    page.fill(f"{form} input[name=clients]", "127.0.0.1/32, 10.0.0.0/8")
    page.check(f"{form} input[name=case_insensitive]")
    page.click(f"{form} button[type=submit]")
    page.wait_for_selector("#smb-shares tr[data-share=team]")
    share = smb_service.get_share(catalog, "team")
    assert (share.path, share.users, share.clients, share.case_insensitive, share.access) == (
        "/projects/team",
        "dana",
        "127.0.0.1/32,10.0.0.0/8",
        True,
        "rw",
    )

    page.click("#smb-shares tr[data-share=team] a:has-text('Edit')")
    page.wait_for_selector("#edit-share")
    page.select_option("#edit-share select[name=access]", "ro")
    page.check("#edit-share input[name=guest]")
    page.click("#edit-share button[type=submit]")
    page.wait_for_selector("#smb-shares tr[data-share=team]")
    share = smb_service.get_share(catalog, "team")
    assert share.read_only and share.guest and share.case_insensitive

    page.fill("#smb-users tr[data-user=dana] input[name=password]", "second pw")
    page.click("#smb-users tr[data-user=dana] button:has-text('Set password')")
    page.wait_for_load_state()
    assert "SMB user dana: password changed" in page.inner_text(".flash")

    page.click("#smb-shares tr[data-share=team] button:has-text('Delete')")
    page.wait_for_selector("#confirm")
    assert "Delete SMB share team?" in page.inner_text("#confirm")
    assert smb_service.list_shares(catalog)  # not yet
    page.click("#confirm-yes")
    page.wait_for_load_state()
    assert page.locator("#smb-shares").count() == 0 and smb_service.list_shares(catalog) == []

    page.click("#smb-users tr[data-user=dana] button:has-text('Remove')")
    page.wait_for_selector("#confirm")
    page.click("#confirm-yes")
    page.wait_for_load_state()
    assert "No SMB users" in page.inner_text("main")
    assert smb_service.list_users(catalog) == [] and passdb.names() == []
    done = [e for e in events.recent(catalog, 20) if e.kind.startswith("smb.")]
    assert [e.kind for e in done] == [
        "smb.user.delete",
        "smb.share.delete",
        "smb.user.password",
        "smb.share.update",
        "smb.share.create",
        "smb.user.create",
    ]
    assert {e.actor for e in done} == {ADMIN}
