"""The site catalog: where canary placeholders, wiring and hooks go, as TOML data plus its loader."""

from canary_instrument.catalog import model
from canary_instrument.catalog.loader import BUNDLED, build_catalog, find_pyproject, load_catalog
from canary_instrument.catalog.model import *  # noqa: F403 (the names listed in the model's `__all__`)

__all__ = [*model.__all__, "BUNDLED", "build_catalog", "find_pyproject", "load_catalog"]
