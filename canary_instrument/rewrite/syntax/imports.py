"""Import resolution: the local names a file's imports bind, and how the file can spell a qualified name."""

from __future__ import annotations

import ast

from canary_instrument.rewrite.syntax.nodes import statements


class Imports:
    """Local names bound by imports, resolved to qualified names (`cl` -> `contextlib`)."""

    def __init__(self, tree: ast.Module, nodes=None) -> None:
        """`nodes`: `statements(tree)`, when the caller has listed them."""
        self.names: dict[str, str] = {}
        for node in statements(tree) if nodes is None else nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        self.names[top] = top
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.names[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def resolve(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        qualified = self.names.get(head, head)
        return f"{qualified}.{rest}" if rest else qualified

    def spelling(self, qualified: str) -> str | None:
        """How this file can spell a qualified name with its existing imports, or None."""
        module, _, attribute = qualified.rpartition(".")
        for local, target in sorted(self.names.items()):
            if target == qualified:
                return local
        for local, target in sorted(self.names.items()):
            if target == module:
                return f"{local}.{attribute}"
        return None
