"""What HTTP handlers are given (Litestar's `Provide`), instead of reaching into `request.app.state`:
the warm engine, the session store, the settings (and its voice aliases), the caller's tenant, the app's admission."""

from __future__ import annotations

from litestar import Request
from litestar.datastructures import State
from litestar.di import Provide

from engine import Engine
from gateway.admission import Admission
from gateway.auth import caller, serving_engine
from gateway.settings import Settings
from sessions import SessionStore, Tenant


def _engine(request: Request) -> Engine:
    return serving_engine(request)  # 503 engine_not_ready before it is warm


def _tenant(request: Request) -> Tenant:
    return caller(request)  # 401 unauthorized for a missing or wrong key


def _store(state: State) -> SessionStore:
    return state.store


def _settings(state: State) -> Settings:
    return state.settings


def _voice_aliases(state: State) -> dict[str, str]:
    return state.settings.voice_aliases


def _admission(state: State) -> Admission | None:
    return state.get("admission")  # None only before an engine is loaded


DEPENDENCIES = {
    "tenant": Provide(_tenant, sync_to_thread=False),  # first: a caller without a key learns nothing more
    "engine": Provide(_engine, sync_to_thread=False),
    "store": Provide(_store, sync_to_thread=False),
    "settings": Provide(_settings, sync_to_thread=False),
    "voice_aliases": Provide(_voice_aliases, sync_to_thread=False),
    "admission": Provide(_admission, sync_to_thread=False),
}
