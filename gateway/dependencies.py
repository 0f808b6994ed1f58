"""What HTTP handlers are given (Litestar's `Provide`), instead of reaching into `request.app.state`:
the model a request names (`?model=`, else the default) with its warm engine and admission, the models, the
session store, the settings, the model and voice aliases, the caller's tenant."""

from __future__ import annotations

from typing import cast

from litestar import Request
from litestar.datastructures import State
from litestar.di import NamedDependency, Provide

from engine import Engine
from gateway.admission import Admission
from gateway.aliases import Aliases
from gateway.auth import caller, serving_model
from gateway.models import ModelHandle, ModelRegistry
from gateway.settings import Settings
from sessions import SessionStore, Tenant


def _served_model(request: Request) -> ModelHandle:
    return serving_model(request)  # ?model= picks one; 404 unknown_model; 503 engine_not_ready before it is warm


def _engine(served_model: NamedDependency[ModelHandle]) -> Engine:
    return cast(Engine, served_model.served)


def _models(state: State) -> ModelRegistry:
    return state.models


def _tenant(request: Request) -> Tenant:
    return caller(request)  # 401 unauthorized for a missing or wrong key


def _store(state: State) -> SessionStore:
    return state.store


def _settings(state: State) -> Settings:
    return state.settings


def _aliases(state: State) -> Aliases:
    return state.aliases


def _admission(served_model: NamedDependency[ModelHandle]) -> Admission | None:
    return served_model.admission  # the model's own


DEPENDENCIES = {
    "tenant": Provide(_tenant, sync_to_thread=False),  # first: a caller without a key learns nothing more
    "served_model": Provide(_served_model, sync_to_thread=False),
    "engine": Provide(_engine, sync_to_thread=False),
    "models": Provide(_models, sync_to_thread=False),
    "store": Provide(_store, sync_to_thread=False),
    "settings": Provide(_settings, sync_to_thread=False),
    "aliases": Provide(_aliases, sync_to_thread=False),
    "admission": Provide(_admission, sync_to_thread=False),
}
