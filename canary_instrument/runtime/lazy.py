"""Package attributes imported on first use, so importing a package pulls in no torch."""

from __future__ import annotations

from importlib import import_module
from typing import Any, Callable


def lazy_attributes(package: str, table: dict, namespace: dict) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: a name of ``table`` (name -> module) is imported from its
    module when first read, then kept in ``namespace`` (the package's globals)."""

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
