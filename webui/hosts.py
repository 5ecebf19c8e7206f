"""Hosts: the storage hosts of the cluster (failure domains), each with its drives, its state,
the bytes and fragments it holds and what waits to be rebuilt or moved off it; how many hosts
may be lost without losing data; the rebuild and drain jobs under way with their progress.

Read-only, from the catalog (engine.admin.hosts); the actions on hosts are the CLI's and the
REST API's, and those on single drives the Drives page's."""

from __future__ import annotations

from flask import Blueprint, render_template

from engine.admin import hosts
from webui import core

bp = Blueprint("hosts", __name__)


def cluster() -> hosts.Cluster:
    shingle = core.ctx()
    k, m = hosts.stripe_shape(shingle.policies)
    return hosts.cluster(shingle.catalog, k, m)


@bp.route("/hosts")
@core.login_required
def index():
    return render_template("hosts.html", cluster=cluster())
