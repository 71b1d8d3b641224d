"""Load the bundled catalog, overlay the target's `[tool.canary-instrument]` and `--catalog FILE`, validate.

An overlay has the catalog's own format. Scalars and managers replace; a `sites` or
`hooks` entry whose role exists updates that role's fields (`extend_candidates`
appends locations), a new role is added; `triggers` replaces, `extend_triggers`
appends; `default = false` drops the bundled catalog first.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

from canary_instrument.catalog.model import (
    EVIDENCE,
    TRIGGER_KINDS,
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


_TOP_KEYS = {
    "default", "runtime_module", "member", "placeholder_factory", "managers", "sites", "hooks",
    "triggers", "extend_triggers", "exclude", "catalog", "null_contexts", "model_runner", "kv_forward",
}
_SITE_KEYS = {
    "role", "placeholder", "shape", "calls", "wiring", "item", "loop", "candidates", "extend_candidates",
    "manager", "requires", "class_refs", "evidence",
}
_HOOK_KEYS = {
    "role", "place", "after_calls", "assigns", "statement", "scope", "manager", "candidates", "extend_candidates",
}
_MODEL_RUNNER_KEYS = {"class_calls", "names", "types"}
_SHAPES = ("wrap", "with_item", "argument")
_PLACES = ("after_assign", "after_capture")
_SCOPES = ("model_runner", "holder", "manager")
_LOCATION_KEYS = {"path", "classes", "methods", "manager"}
_TRIGGER_KEYS = {"calls", "what", "kind"}
_KV_FORWARD_KEYS = {"methods", "batch_types", "batch_names"}


def _check_layer(source: str, raw: dict) -> None:
    """Reject unknown keys and wrongly typed containers in one layer, naming the layer."""
    for key in raw:
        if key not in _TOP_KEYS:
            raise CatalogError(f"{source}: {key}: unknown catalog field (known: {', '.join(sorted(_TOP_KEYS))})")
    if "catalog" in raw:
        raise CatalogError(f"{source}: catalog: give a catalog file with --catalog FILE, not inside a catalog")
    for key in ("sites", "hooks", "triggers", "extend_triggers"):
        if key in raw and not (isinstance(raw[key], list) and all(isinstance(e, dict) for e in raw[key])):
            raise CatalogError(f"{source}: {key}: expected an array of tables ([[{key}]])")
    if "model_runner" in raw:
        if not isinstance(raw["model_runner"], dict):
            raise CatalogError(f"{source}: model_runner: expected a table [model_runner]")
        for field in raw["model_runner"]:
            if field not in _MODEL_RUNNER_KEYS:
                raise CatalogError(
                    f"{source}: model_runner.{field}: unknown field (known: {', '.join(sorted(_MODEL_RUNNER_KEYS))})"
                )
    for key in ("triggers", "extend_triggers"):
        for index, entry in enumerate(raw.get(key, [])):
            for field in entry:
                if field not in _TRIGGER_KEYS:
                    raise CatalogError(
                        f"{source}: {key}[{index}].{field}: unknown field (known: {', '.join(sorted(_TRIGGER_KEYS))})"
                    )
    if "kv_forward" in raw:
        if not isinstance(raw["kv_forward"], dict):
            raise CatalogError(f"{source}: kv_forward: expected a table [kv_forward]")
        for field in raw["kv_forward"]:
            if field not in _KV_FORWARD_KEYS:
                raise CatalogError(
                    f"{source}: kv_forward.{field}: unknown field (known: {', '.join(sorted(_KV_FORWARD_KEYS))})"
                )
    if "managers" in raw and not (
        isinstance(raw["managers"], dict) and all(isinstance(v, dict) for v in raw["managers"].values())
    ):
        raise CatalogError(f"{source}: managers: expected tables [managers.NAME]")
    for key, known in (("sites", _SITE_KEYS), ("hooks", _HOOK_KEYS)):
        for index, entry in enumerate(raw.get(key, [])):
            where = f"{source}: {key}[{index}]"
            if not isinstance(entry.get("role"), str):
                raise CatalogError(f"{where}.role: expected a string naming the role")
            for field in entry:
                if field not in known:
                    raise CatalogError(f"{where}.{field}: unknown field (known: {', '.join(sorted(known))})")
            for field in ("candidates", "extend_candidates"):
                for position, location in enumerate(entry.get(field, [])):
                    if not isinstance(location, dict):
                        raise CatalogError(f"{where}.{field}[{position}]: expected a table")
                    for name in location:
                        if name not in _LOCATION_KEYS:
                            raise CatalogError(
                                f"{where}.{field}[{position}].{name}: unknown field "
                                f"(known: {', '.join(sorted(_LOCATION_KEYS))})"
                            )


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


def _validate(raw: dict, source: str, sources: tuple[str, ...]) -> Catalog:
    def string(value, where, required=True):
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise CatalogError(f"{source}: {where}: expected a non-empty string, got {value!r}")
        return value

    def strings(value, where, empty=False):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or (not value and not empty) or not all(isinstance(v, str) and v for v in value):
            raise CatalogError(f"{source}: {where}: expected a non-empty list of strings, got {value!r}")
        return tuple(value)

    def expression(value, where, loop_index="i"):
        text = string(value, where)
        try:
            ast.parse(text.replace("{loop_index}", loop_index), mode="eval")
        except SyntaxError as error:
            raise CatalogError(f"{source}: {where}: not a Python expression: {error.msg}: {text!r}") from None
        return text

    def manager_name(value, where):
        name = string(value, where)
        if name not in managers:
            raise CatalogError(
                f"{source}: {where}: {name!r} is not a [managers.NAME] table "
                f"(known: {', '.join(sorted(managers)) or 'none'})"
            )
        return name

    runtime_module = string(raw.get("runtime_module", "canary_instrument.runtime"), "runtime_module")
    if not all(part.isidentifier() for part in runtime_module.split(".")):
        raise CatalogError(f"{source}: runtime_module: expected a dotted module name, got {runtime_module!r}")
    member = string(raw.get("member", "canary_ctx"), "member")
    if not member.isidentifier():
        raise CatalogError(f"{source}: member: expected an identifier, got {member!r}")
    factory = string(raw.get("placeholder_factory", "contextlib.nullcontext"), "placeholder_factory")
    if "." not in factory:
        raise CatalogError(f"{source}: placeholder_factory: expected a qualified name such as contextlib.nullcontext")
    null_contexts = strings(raw.get("null_contexts", ["nullcontext", "empty_context"]), "null_contexts", empty=True)
    shape_raw = raw.get("model_runner", {})
    default_shape = ModelRunnerShape()
    model_runner = ModelRunnerShape(
        class_calls=strings(shape_raw.get("class_calls", list(default_shape.class_calls)), "model_runner.class_calls"),
        names=strings(shape_raw.get("names", list(default_shape.names)), "model_runner.names"),
        types=strings(shape_raw.get("types", list(default_shape.types)), "model_runner.types", empty=True),
    )

    managers = {}
    for name, fields in raw.get("managers", {}).items():
        where = f"managers.{name}"
        managers[name] = Manager(
            name=name,
            expression=expression(fields.get("expression"), f"{where}.expression"),
            guard=expression(fields["guard"], f"{where}.guard") if "guard" in fields else None,
        )

    def locations(entry, where):
        result = []
        candidates = entry.get("candidates", [])
        if not isinstance(candidates, list):
            raise CatalogError(f"{source}: {where}.candidates: expected [[...candidates]] locations")
        for position, location in enumerate(candidates):
            at = f"{where}.candidates[{position}]"
            manager = location.get("manager")
            if manager is not None:
                manager = manager_name(manager, f"{at}.manager")
            result.append(
                Location(
                    path=string(location.get("path"), f"{at}.path"),
                    classes=strings(location.get("classes", ["*"]), f"{at}.classes"),
                    methods=strings(location.get("methods", ["*"]), f"{at}.methods"),
                    manager=manager,
                )
            )
        return tuple(result)

    sites = []
    for entry in raw.get("sites", []):
        where = f"sites[role={entry['role']}]"
        shape = entry.get("shape")
        if shape not in _SHAPES:
            raise CatalogError(f"{source}: {where}.shape: expected one of {', '.join(_SHAPES)}, got {shape!r}")
        item = entry.get("item", "first")
        if item not in ("first", "last"):
            raise CatalogError(f"{source}: {where}.item: expected \"first\" or \"last\", got {item!r}")
        loop = entry.get("loop", False)
        if not isinstance(loop, bool):
            raise CatalogError(f"{source}: {where}.loop: expected true or false, got {loop!r}")
        wiring = expression(entry.get("wiring"), f"{where}.wiring")
        if "{loop_index}" in wiring and not loop:
            raise CatalogError(f"{source}: {where}.wiring: uses {{loop_index}} but the site has no `loop = true`")
        placeholder = string(entry.get("placeholder"), f"{where}.placeholder")
        if not placeholder.isidentifier():
            raise CatalogError(f"{source}: {where}.placeholder: expected an identifier, got {placeholder!r}")
        candidates = locations(entry, where)
        manager = entry.get("manager")
        if manager is None:
            # Older catalogs named the manager per candidate.
            manager = next((c.manager for c in candidates if c.manager), None)
        manager = manager_name(manager, f"{where}.manager")
        evidence = strings(entry.get("evidence", []), f"{where}.evidence", empty=True)
        for name in evidence:
            if name not in EVIDENCE:
                raise CatalogError(f"{source}: {where}.evidence: {name!r} is not one of {', '.join(EVIDENCE)}")
        sites.append(
            Site(
                role=entry["role"],
                placeholder=placeholder,
                shape=shape,
                calls=strings(entry.get("calls"), f"{where}.calls"),
                wiring=wiring,
                manager=manager,
                candidates=candidates,
                item=item,
                loop=loop,
                requires=strings(entry.get("requires", []), f"{where}.requires", empty=True),
                class_refs=strings(entry.get("class_refs", []), f"{where}.class_refs", empty=True),
                evidence=evidence,
            )
        )

    hooks = []
    for entry in raw.get("hooks", []):
        where = f"hooks[role={entry['role']}]"
        statement = string(entry.get("statement"), f"{where}.statement")
        try:
            parsed = ast.parse(statement.replace("{model_runner}", "self").replace("{value}", "self.value"))
        except SyntaxError as error:
            raise CatalogError(f"{source}: {where}.statement: not a Python statement: {error.msg}") from None
        if len(parsed.body) != 1 or not isinstance(parsed.body[0], (ast.Assign, ast.Expr)):
            raise CatalogError(f"{source}: {where}.statement: expected one assignment or call statement")
        place = entry.get("place", "after_assign")
        if place not in _PLACES:
            raise CatalogError(f"{source}: {where}.place: expected one of {', '.join(_PLACES)}, got {place!r}")
        scope = entry.get("scope", "model_runner")
        if scope not in _SCOPES:
            raise CatalogError(f"{source}: {where}.scope: expected one of {', '.join(_SCOPES)}, got {scope!r}")
        manager = entry.get("manager")
        if scope == "manager" or manager is not None:
            manager = manager_name(manager, f"{where}.manager")
        after_calls = strings(entry.get("after_calls", []), f"{where}.after_calls", empty=True)
        assigns = strings(entry.get("assigns", []), f"{where}.assigns", empty=True)
        if not after_calls and not assigns:
            raise CatalogError(f"{source}: {where}.after_calls: a hook needs `after_calls` or `assigns`")
        hooks.append(
            Hook(
                role=entry["role"],
                place=place,
                statement=statement,
                scope=scope,
                after_calls=after_calls,
                assigns=assigns,
                manager=manager,
                candidates=locations(entry, where),
            )
        )

    triggers = []
    for index, entry in enumerate(raw.get("triggers", [])):
        kind = entry.get("kind", "forward")
        if kind not in TRIGGER_KINDS:
            raise CatalogError(
                f"{source}: triggers[{index}].kind: expected one of {', '.join(TRIGGER_KINDS)}, got {kind!r}"
            )
        triggers.append(
            Trigger(
                calls=strings(entry.get("calls"), f"triggers[{index}].calls"),
                what=string(entry.get("what", "forward path"), f"triggers[{index}].what"),
                kind=kind,
            )
        )
    kv_raw = raw.get("kv_forward", {})
    defaults = KvForward()
    kv_forward = KvForward(**{
        name: strings(kv_raw[name], f"kv_forward.{name}") if name in kv_raw else getattr(defaults, name)
        for name in _KV_FORWARD_KEYS
    })

    exclude = raw.get("exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise CatalogError(f"{source}: exclude: expected a list of path patterns, got {exclude!r}")

    return Catalog(
        runtime_module=runtime_module,
        member=member,
        placeholder_factory=factory,
        managers=managers,
        sites=tuple(sites),
        hooks=tuple(hooks),
        triggers=tuple(triggers),
        exclude=tuple(exclude),
        sources=sources,
        null_contexts=null_contexts,
        model_runner=model_runner,
        kv_forward=kv_forward,
    )
