"""Load the bundled catalog, overlay the target's `[tool.canary-instrument]` and `--catalog FILE`, validate.

An overlay has the catalog's own format. Scalars and managers replace; a `sites` or
`hooks` entry whose role exists updates that role's fields (`extend_candidates`
appends locations), a new role is added; `triggers` replaces, `extend_triggers`
appends; `default = false` drops the bundled catalog first.
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import MISSING, fields
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from canary_instrument.catalog.model import (
    Catalog,
    CatalogError,
    Hook,
    KvForward,
    Location,
    Manager,
    ModelRunnerShape,
    Site,
    Trigger,
)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

BUNDLED = Path(__file__).with_name("sglang.toml")
PYPROJECT_TABLE = "tool.canary-instrument"


def load_catalog(target: str | Path | None = None, catalog_file: str | Path | None = None) -> Catalog:
    """The catalog for a target tree: bundled sglang catalog + pyproject overlay + `catalog_file` overlay."""
    layers: list[tuple[str, dict]] = [(str(BUNDLED), _read_toml(BUNDLED))]
    if target is not None:
        pyproject = find_pyproject(Path(target))
        if pyproject is not None:
            table = _read_toml(pyproject).get("tool", {}).get("canary-instrument")
            if table:
                layers.append((f"{pyproject} [{PYPROJECT_TABLE}]", table))
    if catalog_file is not None:
        layers.append((str(catalog_file), _read_toml(Path(catalog_file))))
    return build_catalog(layers)


def find_pyproject(target: Path) -> Path | None:
    """The nearest pyproject.toml at or above the target (ruff and black search the same way)."""
    start = target.resolve()
    if not start.is_dir():
        start = start.parent
    for folder in (start, *start.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def build_catalog(layers: list[tuple[str, dict]]) -> Catalog:
    """Merge raw catalog layers in order and validate the result."""
    merged: dict[str, Any] = {}
    for source, raw in layers:
        _check_layer(source, raw)
        merged = _overlay(merged, raw)
    sources = tuple(source for source, _ in layers)
    return _validate(merged, " + ".join(sources), sources)


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as error:
        raise CatalogError(f"{path}: cannot read catalog: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"{path}: not valid TOML: {error}") from None


# The TOML tables and the model dataclass each is checked against (model.py's field types are the schema).
_TABLES = {"sites": Site, "hooks": Hook, "triggers": Trigger, "extend_triggers": Trigger}
_EXTENDS = {"extend_candidates"}  # overlay-only keys of a site or hook: merged into `candidates`
_TOP_KEYS = {f.name for f in fields(Catalog)} - {"sources", "per_file_ignores"} | {
    "default", "catalog", "extend_triggers", "per-file-ignores"}
_CODE = re.compile(r"CI[0-9]{3}")  # a finding code, as `ignore` and `per-file-ignores` name them


def _known(cls) -> set[str]:
    return {f.name for f in fields(cls) if not f.metadata.get("internal")} | (_EXTENDS if cls in (Site, Hook) else set())


def _unknown(source: str, where: str, table: dict, cls) -> None:
    known = _known(cls)
    for name in table:
        if name not in known:
            raise CatalogError(f"{source}: {where}.{name}: unknown field (known: {', '.join(sorted(known))})")


def _check_layer(source: str, raw: dict) -> None:
    """Reject unknown keys and wrongly typed containers in one layer, naming the layer (values are
    checked once the layers are merged)."""
    for key in raw:
        if key not in _TOP_KEYS:
            raise CatalogError(f"{source}: {key}: unknown catalog field (known: {', '.join(sorted(_TOP_KEYS))})")
    if "catalog" in raw:
        raise CatalogError(f"{source}: catalog: give a catalog file with --catalog FILE, not inside a catalog")
    for key, cls in _TABLES.items():
        if key in raw and not (isinstance(raw[key], list) and all(isinstance(e, dict) for e in raw[key])):
            raise CatalogError(f"{source}: {key}: expected an array of tables ([[{key}]])")
        for index, entry in enumerate(raw.get(key, [])):
            where = f"{key}[{index}]"
            if cls in (Site, Hook) and not isinstance(entry.get("role"), str):
                raise CatalogError(f"{source}: {where}.role: expected a string naming the role")
            _unknown(source, where, entry, cls)
            for name in ("candidates", "extend_candidates"):
                for position, location in enumerate(entry.get(name, [])):
                    if not isinstance(location, dict):
                        raise CatalogError(f"{source}: {where}.{name}[{position}]: expected a table")
                    _unknown(source, f"{where}.{name}[{position}]", location, Location)
    for key, cls in (("model_runner", ModelRunnerShape), ("kv_forward", KvForward)):
        if key in raw:
            if not isinstance(raw[key], dict):
                raise CatalogError(f"{source}: {key}: expected a table [{key}]")
            _unknown(source, key, raw[key], cls)
    if "managers" in raw and not (
        isinstance(raw["managers"], dict) and all(isinstance(v, dict) for v in raw["managers"].values())
    ):
        raise CatalogError(f"{source}: managers: expected tables [managers.NAME]")


def _overlay(base: dict, layer: dict) -> dict:
    merged = {} if layer.get("default", True) is False else copy.deepcopy(base)
    for key, value in layer.items():
        if key in ("default",):
            continue
        if key in ("kv_forward", "model_runner"):
            merged[key] = {**merged.get(key, {}), **copy.deepcopy(value)}
        elif key == "managers":
            tables = merged.setdefault(key, {})
            for name, fields in value.items():
                tables[name] = {**tables.get(name, {}), **fields}
        elif key in ("sites", "hooks"):
            entries = merged.setdefault(key, [])
            for entry in value:
                existing = next((e for e in entries if e.get("role") == entry["role"]), None)
                if existing is None:
                    existing = {}
                    entries.append(existing)
                extra = entry.get("extend_candidates", [])
                existing.update({k: copy.deepcopy(v) for k, v in entry.items() if k != "extend_candidates"})
                existing["candidates"] = existing.get("candidates", []) + copy.deepcopy(extra)
        elif key == "extend_triggers":
            merged["triggers"] = merged.get("triggers", []) + copy.deepcopy(value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _conform(value, kind, where: str, source: str, empty: bool = False):
    """`value` checked against a model field's type (str, bool, a Literal, `X | None`, `tuple[X, ...]`)."""
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, UnionType):
        if value is None:
            return None
        (kind,) = (arg for arg in args if arg is not type(None))
        origin, args = get_origin(kind), get_args(kind)
    if kind is str:
        if not isinstance(value, str) or not value:
            raise CatalogError(f"{source}: {where}: expected a non-empty string, got {value!r}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise CatalogError(f"{source}: {where}: expected true or false, got {value!r}")
        return value
    if origin is Literal:
        if value not in args:
            raise CatalogError(f"{source}: {where}: expected one of {', '.join(args)}, got {value!r}")
        return value
    if origin is tuple and args[1:] == (Ellipsis,):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or (not value and not empty) or not all(isinstance(v, str) and v for v in value):
            raise CatalogError(f"{source}: {where}: expected a non-empty list of strings, got {value!r}")
        if get_origin(args[0]) is Literal:
            for item in value:
                if item not in get_args(args[0]):
                    raise CatalogError(f"{source}: {where}: {item!r} is not one of {', '.join(get_args(args[0]))}")
        return tuple(value)
    raise TypeError(f"no catalog check for {kind!r}")  # a model field of a type this loader does not know


def _values(cls, table: dict, where: str, source: str, skip: tuple[str, ...] = ()) -> dict:
    """The fields of `cls` that `table` gives (and those it must give), checked against the model's types."""
    out = {}
    prefix = f"{where}." if where else ""
    for name, kind, required, empty in _schema(cls):
        if name in skip:
            continue
        if name in table:
            value = table[name]
        elif required:
            value = None  # missing: the type's check names what was expected
        else:
            continue
        out[name] = _conform(value, kind, prefix + name, source, empty)
    return out


_SCHEMAS: dict[type, list[tuple]] = {}


def _schema(cls) -> list[tuple]:
    """(name, type, required, may be empty) of each field of a model class."""
    schema = _SCHEMAS.get(cls)
    if schema is None:
        schema = _SCHEMAS[cls] = [
            (f.name, f.type, f.default is MISSING, f.metadata.get("empty", False) or f.default == ())
            for f in fields(cls)
        ]
    return schema


def _validate(raw: dict, source: str, sources: tuple[str, ...]) -> Catalog:
    def expression(value, where, loop_index="i"):
        try:
            ast.parse(value.replace("{loop_index}", loop_index), mode="eval")
        except SyntaxError as error:
            raise CatalogError(f"{source}: {where}: not a Python expression: {error.msg}: {value!r}") from None
        return value

    def manager_name(value, where):
        name = _conform(value, str, where, source)
        if name not in managers:
            raise CatalogError(
                f"{source}: {where}: {name!r} is not a [managers.NAME] table "
                f"(known: {', '.join(sorted(managers)) or 'none'})"
            )
        return name

    top = _values(Catalog, {
        "runtime_module": "canary_instrument.runtime", "member": "canary_ctx",
        "placeholder_factory": "contextlib.nullcontext", **raw,
    }, "", source, skip=("managers", "sites", "hooks", "triggers", "exclude", "sources", "model_runner", "kv_forward"))
    runtime_module = top["runtime_module"]
    if not all(part.isidentifier() for part in runtime_module.split(".")):
        raise CatalogError(f"{source}: runtime_module: expected a dotted module name, got {runtime_module!r}")
    if not top["member"].isidentifier():
        raise CatalogError(f"{source}: member: expected an identifier, got {top['member']!r}")
    if "." not in top["placeholder_factory"]:
        raise CatalogError(f"{source}: placeholder_factory: expected a qualified name such as contextlib.nullcontext")
    model_runner = ModelRunnerShape(**_values(ModelRunnerShape, raw.get("model_runner", {}), "model_runner", source))
    kv_forward = KvForward(**_values(KvForward, raw.get("kv_forward", {}), "kv_forward", source))

    managers = {}
    for name, table in raw.get("managers", {}).items():
        where = f"managers.{name}"
        values = _values(Manager, table, where, source, skip=("name",))
        managers[name] = Manager(
            name=name,
            expression=expression(values["expression"], f"{where}.expression"),
            guard=expression(values["guard"], f"{where}.guard") if values.get("guard") is not None else None,
        )

    def locations(entry, where):
        candidates = entry.get("candidates", [])
        if not isinstance(candidates, list):
            raise CatalogError(f"{source}: {where}.candidates: expected [[...candidates]] locations")
        result = []
        for position, table in enumerate(candidates):
            at = f"{where}.candidates[{position}]"
            location = Location(**_values(Location, table, at, source))
            if location.manager is not None:
                manager_name(location.manager, f"{at}.manager")
            result.append(location)
        return tuple(result)

    sites = []
    for entry in raw.get("sites", []):
        where = f"sites[role={entry['role']}]"
        values = _values(Site, entry, where, source, skip=("manager", "candidates"))
        wiring = expression(values["wiring"], f"{where}.wiring")
        if "{loop_index}" in wiring and not values.get("loop", False):
            raise CatalogError(f"{source}: {where}.wiring: uses {{loop_index}} but the site has no `loop = true`")
        if not values["placeholder"].isidentifier():
            raise CatalogError(f"{source}: {where}.placeholder: expected an identifier, got {values['placeholder']!r}")
        if not values["calls"] and (values.get("shape") != "wrap" or values.get("loop") or values.get("requires")):
            raise CatalogError(
                f"{source}: {where}.calls: empty: only a `shape = \"wrap\"` role without `loop` or `requires` may "
                "name no calls (scaffold places it on uncovered forward paths only)"
            )
        candidates = locations(entry, where)
        manager = entry.get("manager")
        if manager is None:
            # Older catalogs named the manager per candidate.
            manager = next((c.manager for c in candidates if c.manager), None)
        sites.append(Site(**values, manager=manager_name(manager, f"{where}.manager"), candidates=candidates))

    hooks = []
    for entry in raw.get("hooks", []):
        where = f"hooks[role={entry['role']}]"
        values = _values(Hook, entry, where, source, skip=("manager", "candidates"))
        try:
            parsed = ast.parse(values["statement"].replace("{model_runner}", "self").replace("{value}", "self.value"))
        except SyntaxError as error:
            raise CatalogError(f"{source}: {where}.statement: not a Python statement: {error.msg}") from None
        if len(parsed.body) != 1 or not isinstance(parsed.body[0], (ast.Assign, ast.Expr)):
            raise CatalogError(f"{source}: {where}.statement: expected one assignment or call statement")
        manager = entry.get("manager")
        if values.get("scope") == "manager" or manager is not None:
            manager = manager_name(manager, f"{where}.manager")
        if not values.get("after_calls") and not values.get("assigns"):
            raise CatalogError(f"{source}: {where}.after_calls: a hook needs `after_calls` or `assigns`")
        hooks.append(Hook(**values, manager=manager, candidates=locations(entry, where)))

    triggers = tuple(
        Trigger(**_values(Trigger, entry, f"triggers[{index}]", source))
        for index, entry in enumerate(raw.get("triggers", []))
    )

    exclude = raw.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise CatalogError(f"{source}: exclude: expected a list of path patterns, got {exclude!r}")

    def codes(value, where):
        if not isinstance(value, list) or not all(isinstance(c, str) and _CODE.fullmatch(c) for c in value):
            raise CatalogError(f"{source}: {where}: expected a list of finding codes such as \"CI301\", got {value!r}")
        return tuple(value)

    per_file = raw.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise CatalogError(f"{source}: per-file-ignores: expected a table of path pattern = [codes], got {per_file!r}")

    return Catalog(
        runtime_module=runtime_module,
        member=top["member"],
        placeholder_factory=top["placeholder_factory"],
        managers=managers,
        sites=tuple(sites),
        hooks=tuple(hooks),
        triggers=triggers,
        exclude=tuple(exclude),
        sources=sources,
        null_contexts=top.get("null_contexts", Catalog.null_contexts),
        model_runner=model_runner,
        kv_forward=kv_forward,
        ignore=codes(raw.get("ignore", []), "ignore"),
        per_file_ignores=tuple(
            (pattern, codes(value, f"per-file-ignores.{pattern}")) for pattern, value in per_file.items()
        ),
    )
