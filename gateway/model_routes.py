"""`GET /v1/models` and `GET /v1/models/{id}`: the models this gateway serves, in OpenAI's shape, for
tenants (the admin plane, gateway/admin.py, says more). Each model's voices: `GET /v1/audio/voices?model=`."""

from __future__ import annotations

import time
from typing import Any

from litestar import get
from litestar.di import NamedDependency
from litestar.params import FromPath

from gateway.models import ModelHandle, ModelRegistry, ModelUnavailable
from sessions import Tenant

_STARTED = int(time.time())  # `created` of a model not loaded now


def _openai(handle: ModelHandle) -> dict[str, Any]:
    created = int(handle.loaded_at) if handle.loaded_at is not None else _STARTED
    return {"id": handle.name, "object": "model", "created": created, "owned_by": "voxgate"}


@get("/v1/models", sync_to_thread=False)
def list_models(tenant: NamedDependency[Tenant], models: NamedDependency[ModelRegistry]) -> dict[str, Any]:
    """Every model configured, the default first; a model that cannot serve now is listed too (its
    requests are answered with the reason: /health and the admin plane tell its state)."""
    return {"object": "list", "data": [_openai(h) for h in models]}


@get("/v1/models/{model_id:str}", sync_to_thread=False)
def retrieve_model(tenant: NamedDependency[Tenant], models: NamedDependency[ModelRegistry],
                   model_id: FromPath[str]) -> dict[str, Any]:  # fmt: skip
    try:
        return _openai(models.handle(model_id))
    except ModelUnavailable as e:
        raise e.api_error() from None


model_routes = [list_models, retrieve_model]
