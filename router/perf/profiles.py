"""GPU and model profiles: the data the performance model runs on.

The package ships ``gpus.yaml`` and ``models.yaml`` beside this module; a user adds or overrides
profiles with more files of the same shape (``gpus:`` and/or ``models:`` at the top). A later
file wins over an earlier one for a profile of the same name (the aliases of both stay).
Every problem in a file is reported at once, each with the file, line and dotted key, as one
:class:`~router.errors.ConfigError`; unknown keys are problems too.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from router.errors import ConfigError, GpuRouterError, Problem
from router.yaml_lines import FILE_KEY, LineMap, read_yaml

__all__ = [
    "DTYPE_BYTES",
    "GpuProfile",
    "ModelProfile",
    "ProfileCatalog",
    "UnknownProfileError",
    "default_catalog",
    "load_catalog",
]

DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"fp16": 2, "bf16": 2})
"""Weight and KV-cache dtypes the model knows, with their size in bytes."""

_PACKAGE_FILES = (Path(__file__).with_name("gpus.yaml"), Path(__file__).with_name("models.yaml"))


class UnknownProfileError(GpuRouterError):
    """A GPU or model name matches no profile (nor any profile's alias)."""

    title = "unknown profile"


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """One GPU model, as its datasheet describes it (dense math, no sparsity)."""

    name: str
    """Canonical name, for example ``A100-80GB``."""
    fp16_tflops: float
    """Dense fp16 tensor-core peak in TFLOP/s; bf16 runs at the same rate where it exists."""
    bf16: bool
    """Whether the card has bf16 tensor cores (Volta and Turing do not)."""
    bandwidth_gbs: float
    """Memory bandwidth in GB/s (10^9 bytes per second)."""
    memory_mib: int
    """Memory the driver reports (nvidia-smi's total), in MiB."""
    aliases: tuple[str, ...] = ()
    """Other names for the same card, matched without regard to case."""
    source: str = ""
    """Where the figures come from."""
    tdp_w: float | None = None
    """Board power limit (TDP) in watts, as the datasheet gives it; None when unknown."""
    idle_w: float | None = None
    """Power drawn when idle, in watts; None means 17% of ``tdp_w`` (a typical idle draw)."""

    @property
    def idle_power_w(self) -> float | None:
        """Idle power in watts: ``idle_w``, else 17% of ``tdp_w``; None when neither is known."""
        if self.idle_w is not None:
            return self.idle_w
        return None if self.tdp_w is None else 0.17 * self.tdp_w

    @property
    def peak_flops(self) -> float:
        """Dense fp16/bf16 peak in FLOP/s."""
        return self.fp16_tflops * 1e12

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Memory bandwidth in bytes per second."""
        return self.bandwidth_gbs * 1e9

    @property
    def memory_bytes(self) -> int:
        """Device memory in bytes."""
        return self.memory_mib * 2**20


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """One dense decoder-only model: what its weights and KV cache cost."""

    name: str
    """Canonical name, for example ``Llama-3.1-8B``."""
    params: int
    """Parameters, embeddings included."""
    layers: int
    """Transformer layers."""
    attention_heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (fewer than query heads under grouped-query attention)."""
    head_dim: int
    """Width of one head."""
    dtype: str
    """Weight and KV-cache dtype: ``bf16`` or ``fp16``."""
    max_context_tokens: int
    """Longest context the model supports (prompt plus output)."""
    aliases: tuple[str, ...] = ()
    """Other names, for example Hugging Face ids, matched without regard to case."""
    source: str = ""
    """Where the figures come from."""

    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight and per KV-cache element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def query_width(self) -> int:
        """attention_heads * head_dim: the width attention's matrix products run over."""
        return self.attention_heads * self.head_dim


_P = TypeVar("_P", bound=GpuProfile | ModelProfile)


@dataclass(frozen=True, slots=True)
class ProfileCatalog:
    """GPU and model profiles by canonical name, with lookup by name or alias."""

    gpus: Mapping[str, GpuProfile]
    models: Mapping[str, ModelProfile]

    def gpu(self, name: str) -> GpuProfile:
        """The GPU profile called ``name`` (or with that alias); UnknownProfileError otherwise."""
        return _lookup("GPU", name, self.gpus)

    def model(self, name: str) -> ModelProfile:
        """The model profile called ``name`` (or with that alias); UnknownProfileError otherwise."""
        return _lookup("model", name, self.models)


def _lookup(kind: str, name: str, profiles: Mapping[str, _P]) -> _P:
    wanted = name.casefold()
    for profile in profiles.values():
        if wanted in {n.casefold() for n in (profile.name, *profile.aliases)}:
            return profile
    close = difflib.get_close_matches(name, list(profiles), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    known = ", ".join(sorted(profiles))
    raise UnknownProfileError(f"no {kind} profile called {name!r}{hint} (known: {known})")


def load_catalog(extra_paths: Iterable[str | os.PathLike[str]] = ()) -> ProfileCatalog:
    """Read the package's profiles, then each extra file in order (later files win)."""
    gpus: dict[str, GpuProfile] = {}
    models: dict[str, ModelProfile] = {}
    for path in (*_PACKAGE_FILES, *(Path(p) for p in extra_paths)):
        file_gpus, file_models = _parse_file(path)
        _merge(path, "gpus", gpus, file_gpus)
        _merge(path, "models", models, file_models)
    return ProfileCatalog(MappingProxyType(gpus), MappingProxyType(models))


@functools.cache
def default_catalog() -> ProfileCatalog:
    """The package's own profiles, read once."""
    return load_catalog()


def _merge(path: Path, section: str, into: dict[str, _P], new: Mapping[str, _P]) -> None:
    """Add ``new`` to ``into``; an alias that already names another profile is a problem.

    A profile that replaces one of the same name keeps the old one's aliases too.
    """
    problems = []
    for name, given in new.items():
        profile = given
        if name in into:
            kept = dict.fromkeys((*into[name].aliases, *given.aliases))
            profile = dataclasses.replace(given, aliases=tuple(kept))
        taken = {
            n.casefold(): other.name
            for other in into.values()
            if other.name != name
            for n in (other.name, *other.aliases)
        }
        for alias in (name, *profile.aliases):
            if alias.casefold() in taken:
                message = f"{alias!r} already names {taken[alias.casefold()]!r}"
                problems.append(Problem(str(path), None, f"{section}.{name}", message))
        into[name] = profile
    if problems:
        raise ConfigError(problems)


# --- checking one file --------------------------------------------------------------------

Check = Callable[[Any], str | None]
"""Returns what is wrong with a value, or None when it is fine."""


def _positive_number(value: Any) -> str | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return None if ok and math.isfinite(value) and value > 0 else "must be a number > 0"


def _positive_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return None if ok else "must be a whole number > 0"


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "must be a non-empty string"


def _names(value: Any) -> str | None:
    ok = isinstance(value, list) and all(_text(v) is None for v in value)
    return None if ok else "must be a list of non-empty strings"


def _dtype(value: Any) -> str | None:
    known = ", ".join(DTYPE_BYTES)
    return None if value in DTYPE_BYTES else f"must be one of {known}"


_GPU_FIELDS: Mapping[str, tuple[Check, bool]] = {
    "fp16_tflops": (_positive_number, True),
    "bf16": (_boolean, True),
    "bandwidth_gbs": (_positive_number, True),
    "memory_mib": (_positive_int, True),
    "aliases": (_names, False),
    "source": (_text, False),
    "tdp_w": (_positive_number, False),
    "idle_w": (_positive_number, False),
}
"""Each GPU field's check and whether it is required."""

_MODEL_FIELDS: Mapping[str, tuple[Check, bool]] = {
    "params": (_positive_int, True),
    "layers": (_positive_int, True),
    "attention_heads": (_positive_int, True),
    "kv_heads": (_positive_int, True),
    "head_dim": (_positive_int, True),
    "dtype": (_dtype, True),
    "max_context_tokens": (_positive_int, True),
    "aliases": (_names, False),
    "source": (_text, False),
}
"""Each model field's check and whether it is required."""


def _build_gpu(name: str, fields: Mapping[str, Any]) -> GpuProfile:
    return GpuProfile(
        name=name,
        fp16_tflops=float(fields["fp16_tflops"]),
        bf16=fields["bf16"],
        bandwidth_gbs=float(fields["bandwidth_gbs"]),
        memory_mib=fields["memory_mib"],
        aliases=tuple(fields.get("aliases", ())),
        source=fields.get("source", ""),
        tdp_w=_optional_float(fields.get("tdp_w")),
        idle_w=_optional_float(fields.get("idle_w")),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _build_model(name: str, fields: Mapping[str, Any]) -> ModelProfile:
    return ModelProfile(
        name=name,
        params=fields["params"],
        layers=fields["layers"],
        attention_heads=fields["attention_heads"],
        kv_heads=fields["kv_heads"],
        head_dim=fields["head_dim"],
        dtype=fields["dtype"],
        max_context_tokens=fields["max_context_tokens"],
        aliases=tuple(fields.get("aliases", ())),
        source=fields.get("source", ""),
    )


def _model_consistency(fields: Mapping[str, Any]) -> tuple[str, str] | None:
    """A (key, message) when the head counts contradict each other."""
    if fields["attention_heads"] % fields["kv_heads"]:
        return "kv_heads", "must divide attention_heads (grouped-query attention)"
    return None


def _parse_file(path: Path) -> tuple[dict[str, GpuProfile], dict[str, ModelProfile]]:
    """Every profile in one file; a ConfigError listing every problem otherwise."""
    source = str(path)
    data = read_yaml(path)
    problems: list[Problem] = []
    if not isinstance(data, LineMap):
        message = "must be a mapping with 'gpus:' and/or 'models:' at the top"
        raise ConfigError([Problem(source, None, FILE_KEY, message)])
    for key, line in data.key_lines.items():
        if key not in ("gpus", "models"):
            problems.append(Problem(source, line, str(key), "unknown key; expected gpus, models"))
    gpus = _parse_section(source, data, "gpus", _GPU_FIELDS, _build_gpu, problems)
    models = _parse_section(source, data, "models", _MODEL_FIELDS, _build_model, problems)
    if problems:
        raise ConfigError(problems)
    return gpus, models


def _parse_section(
    source: str,
    data: LineMap,
    section: str,
    spec: Mapping[str, tuple[Check, bool]],
    build: Callable[[str, Mapping[str, Any]], _P],
    problems: list[Problem],
) -> dict[str, _P]:
    entries = data.get(section)
    if entries is None:
        return {}
    if not isinstance(entries, LineMap):
        line = data.key_lines[section]
        problems.append(Problem(source, line, section, "must be a mapping of name: fields"))
        return {}
    for name, line, _ in entries.duplicates:
        problems.append(Problem(source, line, f"{section}.{name}", "defined twice"))
    built: dict[str, _P] = {}
    for name, fields in entries.items():
        where = f"{section}.{name}"
        line = entries.key_lines[name]
        if not isinstance(fields, LineMap):
            problems.append(Problem(source, line, where, "must be a mapping of field: value"))
            continue
        found = _check_fields(source, where, line, fields, spec)
        if not found and section == "models" and (clash := _model_consistency(fields)):
            key, message = clash
            found.append(Problem(source, fields.key_lines[key], f"{where}.{key}", message))
        problems.extend(found)
        if not found:
            built[str(name)] = build(str(name), fields)
    return built


def _check_fields(
    source: str, where: str, line: int, fields: LineMap, spec: Mapping[str, tuple[Check, bool]]
) -> list[Problem]:
    """Problems with one entry's fields; a missing field is reported on the entry's line."""
    found = []
    for key, key_line in fields.key_lines.items():
        if key not in spec:
            close = difflib.get_close_matches(str(key), list(spec), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            found.append(Problem(source, key_line, f"{where}.{key}", f"unknown key{hint}"))
        elif (message := spec[key][0](fields[key])) is not None:
            found.append(Problem(source, key_line, f"{where}.{key}", message))
    for key, (_, required) in spec.items():
        if required and key not in fields:
            found.append(Problem(source, line, f"{where}.{key}", "missing"))
    return found
