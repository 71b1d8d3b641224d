"""The site catalog: where canary placeholders, wiring and hooks go, as TOML data plus its loader."""

from canary_instrument.catalog.loader import BUNDLED, build_catalog, find_pyproject, load_catalog
from canary_instrument.catalog.model import (
    EVIDENCE,
    RUNTIME_EXPORTS,
    Catalog,
    CatalogError,
    Hook,
    KvForward,
    Location,
    Manager,
    ModelRunnerShape,
    Site,
    Trigger,
    call_matches,
    path_matches,
)

__all__ = [
    "BUNDLED", "EVIDENCE", "RUNTIME_EXPORTS", "Catalog", "CatalogError", "Hook", "KvForward", "Location", "Manager",
    "ModelRunnerShape", "Site",
    "Trigger", "build_catalog", "call_matches", "find_pyproject", "load_catalog", "path_matches",
]
