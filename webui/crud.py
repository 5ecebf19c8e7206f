"""The five REST routes of an admin object, declared once per domain.

Exports, SMB shares, retention rules, snapshot schedules and quotas each have the same five
routes: list the collection, create one (201), read, change (PATCH: only the fields given) and
delete one (the id back). ``CrudApi`` holds what differs (the URL, the request schema, the
response schema's name, the summaries, the functions that do the work) and ``register`` makes
the routes with webui/api.py's ``endpoint``, their OpenAPI entries and their response
descriptions (webui/responses.py ``ROUTES``) from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.admin.schema import Schema
from webui import core, responses


@dataclass(frozen=True)
class CrudApi:
    """``collection`` is the URL ("/exports"), ``key`` the id parameter ("export_id");
    ``noun`` names one object after an article ("NFS export") and ``article`` goes before it;
    ``summary`` replaces the default summary of a route, by verb (list, create, get, update,
    delete); ``described`` likewise the description of its response."""

    collection: str
    key: str
    tag: str
    noun: str
    plural: str
    schema: Schema
    response: str  # the response schema's name in webui/responses.py SCHEMAS
    list: Callable[[], list]
    create: Callable[[dict, str], dict]
    get: Callable[[int], dict]
    update: Callable[[int, dict, str], dict]
    delete: Callable[[int, str], None]
    article: str = "a"
    update_schema: Schema | None = None  # the PATCH body, when it differs from the POST body
    summary: dict[str, str] = field(default_factory=dict)
    described: dict[str, str] = field(default_factory=dict)

    @property
    def item(self) -> str:
        return f"{self.collection}/<int:{self.key}>"

    def summaries(self) -> dict[str, str]:
        one = f"{self.article} {self.noun}"
        return {
            "list": self.plural[0].upper() + self.plural[1:],
            "create": f"Create {one}",
            "get": f"One {self.noun}",
            "update": f"Change fields of {one}",
            "delete": f"Delete {one}",
            **self.summary,
        }

    def descriptions(self) -> dict[str, str]:
        short = self.noun.split()[-1]  # "SMB share" -> "the share"
        return {
            "list": f"every {self.noun}",
            "create": f"the new {short}",
            "get": f"the {short}",
            "update": f"the {short} as changed",
            "delete": f"the id of the deleted {short}",
            **self.described,
        }


def engine_calls(
    list_all: Callable, get: Callable, create: Callable, update: Callable, delete: Callable
) -> tuple[Callable, Callable, Callable, Callable, Callable]:
    """(list, create, get, update, delete) for a CrudApi, over an engine domain's module
    functions: they take the catalog first, create and update also the namespace (to check a
    path), and return records with ``to_dict``."""

    def listed() -> list[dict]:
        return [record.to_dict() for record in list_all(core.ctx().catalog)]

    def created(values: dict, who: str) -> dict:
        shingle = core.ctx()
        made = create(shingle.catalog, values, actor=who, namespace=shingle.namespace)
        return made.to_dict()

    def got(ref: int) -> dict:
        return get(core.ctx().catalog, ref).to_dict()

    def updated(ref: int, values: dict, who: str) -> dict:
        shingle = core.ctx()
        made = update(shingle.catalog, ref, values, actor=who, namespace=shingle.namespace)
        return made.to_dict()

    def deleted(ref: int, who: str) -> None:
        delete(core.ctx().catalog, ref, actor=who)

    return listed, created, got, updated, deleted


def register(api: CrudApi, endpoint: Callable[..., Callable]) -> None:
    """The five routes of ``api`` through webui/api.py's ``endpoint`` decorator."""
    summary, described = api.summaries(), api.descriptions()
    name = api.collection.strip("/").replace("/", "_").replace("-", "_")

    def route(verb: str, rule: str, method: str, schema: str, view: Callable, **options: Any):
        responses.ROUTES[(method, rule)] = (schema, described[verb])
        view.__name__ = f"{verb}_{name}"  # the Flask endpoint: api.{verb}_{name}_{method}
        endpoint(rule, method, summary[verb], api.tag, **options)(view)

    route("list", api.collection, "GET", f"{api.response}[]", lambda: api.list())
    route(
        "create",
        api.collection,
        "POST",
        api.response,
        lambda body: api.create(body, core.actor()),
        body=api.schema,
        status=201,
    )
    route("get", api.item, "GET", api.response, lambda **ids: api.get(ids[api.key]))
    route(
        "update",
        api.item,
        "PATCH",
        api.response,
        lambda body, **ids: api.update(ids[api.key], body, core.actor()),
        body=api.update_schema or api.schema,
        partial=True,
    )

    def delete(**ids: int) -> dict:
        api.delete(ids[api.key], core.actor())
        return {"deleted": ids[api.key]}

    route("delete", api.item, "DELETE", "Deleted", delete)
