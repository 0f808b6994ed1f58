"""Pronunciation lexicons over HTTP, per tenant: `PUT/GET/DELETE /v1/lexicons/{name}`, `GET /v1/lexicons`.

A session speaks with one by naming it in `session.config` (`lexicon`); its entries are applied to each
committed segment before normalisation (segmentation/lexicon.py). Stored in the session store
(sessions/lexicon.py), so every replica uses the same.
"""

from __future__ import annotations

from typing import Any

from litestar import Response, delete, get, put
from litestar.di import NamedDependency
from litestar.params import FromPath, JSONBody

from gateway.errors import ApiError
from sessions import SessionStore, Tenant
from sessions.lexicon import MAX_ENTRIES, MAX_SAY_CHARS, MAX_WORD_CHARS, Lexicon, LexiconStore

# The largest valid body: MAX_ENTRIES entries of the longest word and respelling, each character a
# 12-byte JSON escape (a surrogate pair), with room for the quotes and separators.
MAX_BODY_BYTES = MAX_ENTRIES * (MAX_WORD_CHARS + MAX_SAY_CHARS) * 12 + 64 * 1024


def lexicons(store: SessionStore) -> LexiconStore:
    return LexiconStore(store)  # cheap: its scripts are loaded into Redis on first use, by digest


@put("/v1/lexicons/{name:str}", status_code=200, request_max_body_size=MAX_BODY_BYTES)
async def put_lexicon(
    data: JSONBody[Lexicon], tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore],
    name: FromPath[str],
) -> Response[dict[str, Any]]:
    await lexicons(store).put(tenant.name, name, data)
    return Response({"name": name, "entries": len(data.entries)})


@get("/v1/lexicons/{name:str}")
async def get_lexicon(
    tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore], name: FromPath[str]
) -> Response[dict[str, Any]]:
    lexicon = await lexicons(store).get(tenant.name, name)
    if lexicon is None:
        raise ApiError(f"no lexicon {name[:128]!r}", code="lexicon_not_found", status=404)
    return Response({"name": name, "entries": lexicon.entries})


@get("/v1/lexicons")
async def list_lexicons(
    tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore]
) -> Response[dict[str, Any]]:
    return Response({"lexicons": await lexicons(store).names(tenant.name)})


@delete("/v1/lexicons/{name:str}", status_code=200)
async def delete_lexicon(
    tenant: NamedDependency[Tenant], store: NamedDependency[SessionStore], name: FromPath[str]
) -> Response[dict[str, Any]]:
    if not await lexicons(store).delete(tenant.name, name):
        raise ApiError(f"no lexicon {name[:128]!r}", code="lexicon_not_found", status=404)
    return Response({"name": name, "deleted": True})


lexicon_routes = [put_lexicon, get_lexicon, list_lexicons, delete_lexicon]
