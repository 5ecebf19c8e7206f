"""`shingle alerts list|ack|check`: the alerts the daemon raised (engine/admin/alerts.py).

Listing and acknowledging are catalog changes, done directly (the daemon need not run);
``check`` evaluates every source once now, as the daemon does on its schedule, and delivers
what changed (mail, webhook) before it returns."""

from __future__ import annotations

import json
import time

from appliance.cli.common import UsageError, load_config
from appliance.runtime import open_catalog

ALERTS_HELP = """\
Alerts: a drive failed, missing or degraded, SMART pre-fail or temperature, redundancy
reduced, the pool at 80 % / 90 %, scrub found unrepairable data, a job failed, the catalog
unreachable, the web UI's certificate near expiry. Each is active until acknowledged or
until its condition is gone (cleared, with a "cleared" notice by mail and webhook).

actions:
  list [--json] [--open]   alerts, open ones first (--open: active and acknowledged only)
  ack ID                   acknowledge an active alert (it stays open until cleared)
  check                    evaluate every source now and deliver what changed

examples:
  shingle alerts list --json
  shingle alerts ack 12"""


def cmd_alerts(args) -> int:
    from engine.admin.alerts import OPEN, AlertService

    config = load_config(args)
    catalog = open_catalog(config)
    try:
        service = AlertService(catalog)
        if args.action == "list":
            found = service.list(OPEN if args.open else None)
            if args.json:
                print(json.dumps([a.to_dict() for a in found], indent=2, default=str))
            for a in [] if args.json else found:
                print(
                    f"{a.id:>5} {a.state:<12} {a.severity:<8} {a.kind:<19} "
                    f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(a.first_ns / 1e9))}  "
                    f"{a.message}"
                )
            if not found and not args.json:
                print("no alerts")
        elif args.action == "ack":
            if args.alert is None:
                raise UsageError("alerts ack ID")
            alert = service.acknowledge(args.alert, actor="cli")
            print(f"alert {alert.id} acknowledged: {alert.message}")
        else:
            from appliance.maintenance import alert_monitor

            monitor, notifier = alert_monitor(config, catalog)
            if monitor is None:
                raise UsageError("alerts are off (alerts.interval_s = 0)")
            notices = monitor.tick(force=True)
            if notifier is not None:
                notifier.wait_idle(60)
                notifier.stop()
            for notice in notices:
                print(f"{notice.change:<8} {notice.alert.id:>5} {notice.alert.message}")
            if not notices:
                print("nothing changed")
        return 0
    finally:
        catalog.close()


def register(sub) -> None:
    import argparse

    p = sub.add_parser(
        "alerts",
        help="list or acknowledge alerts",
        description=ALERTS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("action", choices=["list", "ack", "check"])
    p.add_argument("alert", nargs="?", type=int, help="ack: the alert's id")
    p.add_argument("--open", action="store_true", help="list: only active and acknowledged")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_alerts)
