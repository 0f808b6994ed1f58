"""Reading checkpoint tensors and loading them into modules with strict key checks.

A directory holds either `model.safetensors` or `model.safetensors.index.json` plus shards. Tensors are
routed to modules by name prefix; every expected key must be present with the right shape, and every
key under a routed prefix must be used — anything else is a CheckpointError that names the keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


class CheckpointError(ValueError):
    """The files on disk do not match the model the config describes."""


def _files(directory: Path, stem: str) -> list[Path]:
    single = directory / f"{stem}.safetensors"
    index = directory / f"{stem}.safetensors.index.json"
    if single.exists():
        return [single]
    if index.exists():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        shards = sorted({directory / name for name in weight_map.values()})
        missing = [s.name for s in shards if not s.exists()]
        if missing:
            raise CheckpointError(f"{index}: shards missing on disk: {missing}")
        return shards
    raise CheckpointError(f"{directory}: neither {single.name} nor {index.name} found")


def read_tensors(directory: str | Path, stem: str = "model") -> dict[str, torch.Tensor]:
    """All tensors of `<stem>.safetensors` (or its sharded index) in `directory`, on the CPU."""
    out: dict[str, torch.Tensor] = {}
    for path in _files(Path(directory), stem):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 — safe_open is not a mapping
                if name in out:
                    raise CheckpointError(f"{path.name}: tensor {name} appears in more than one shard")
                out[name] = f.get_tensor(name)
    return out


def _show(keys: Iterable[str], limit: int = 8) -> str:
    keys = sorted(keys)
    more = f" … (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def load_module(module: nn.Module, tensors: dict[str, torch.Tensor], prefix: str, *,
                exclude: tuple[str, ...] = (), dtype: torch.dtype | None = None, source: str = "") -> None:
    """Copy every `prefix`+name tensor into `module` (strict), skipping names under `exclude` prefixes.

    Raises CheckpointError listing missing, unexpected and mis-shaped keys.
    """
    expected = module.state_dict()
    given = {
        name[len(prefix):]: t for name, t in tensors.items()
        if name.startswith(prefix) and not any(name.startswith(e) for e in exclude)
    }
    missing = expected.keys() - given.keys()
    unexpected = given.keys() - expected.keys()
    shapes = [f"{k} {tuple(given[k].shape)} != {tuple(expected[k].shape)}"
              for k in expected.keys() & given.keys() if given[k].shape != expected[k].shape]
    if missing or unexpected or shapes:
        where = f"{source} {prefix!r}".strip()
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: {_show(prefix + k for k in missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)}: {_show(prefix + k for k in unexpected)}")
        if shapes:
            parts.append(f"wrong shape: {_show(shapes)}")
        raise CheckpointError(f"{where}: " + "; ".join(parts))
    state = {k: (t.to(dtype) if dtype is not None and t.is_floating_point() else t) for k, t in given.items()}
    module.load_state_dict(state, strict=True, assign=True)


def check_routed(tensors: dict[str, torch.Tensor], routed: tuple[str, ...], ignored: tuple[str, ...],
                 source: str) -> None:
    """Every tensor must fall under a routed or a knowingly ignored prefix."""
    stray = [n for n in tensors if not n.startswith(routed + ignored)]
    if stray:
        raise CheckpointError(f"{source}: unexpected {len(stray)} tensors outside {routed}: {_show(stray)}")
