"""The admin web UI: Flask, served by gunicorn (``shingle webui``; webui/gunicorn.conf.py).

Layout (one module per domain, each a blueprint plus the functions the API reuses):
- app.py: ``create_app(config=None)`` (config from $SHINGLE_CONFIG),
  sign-in and CSRF checks, headers
- core.py: the per-process handle (catalog + namespace WITHOUT a data path), login_required, errors
- schema.py: Field/Schema, declared once: form and API validation and the OpenAPI document
- charts.py: server-rendered SVG (stacked bar, bars, line chart, band map); no front-end build
- auth, dashboard, drives, retention, exports, tiers, jobs, events, settings: the pages
- api.py: /api/v1 (+ /api/v1/openapi.json); metrics.py: /metrics (Prometheus text)

The web UI never opens a drive. Metadata changes (rules, exports, drive states, pins, thresholds)
are catalog transactions with an event naming the admin; anything that moves or frees data
(retention runs, drain, rebuild, scrub, cleaning, tiering) is queued as a job (engine.admin.jobs)
for the daemon, whose progress the job pages follow.

The blueprints run no SQL: each calls an engine service (engine.admin.exports, engine.admin.admins,
engine.admin.inventory, engine.admin.tier_settings, engine.admin.health, engine.admin.jobs,
engine.admin.events, engine.snapshots.retention), the same ones the CLI and the daemon use.

What it reads that others write: metric samples (engine.admin.metrics, names documented there) for
the throughput chart and /metrics; jobs and their results; events. What it writes that others read:
``tiering.<TieringPolicy field>`` and ``tiering.path_rules`` settings (engine.admin.tier_settings),
the exports (engine.admin.exports; the NFS server reloads them), retention rules
(engine.snapshots.retention).
"""
