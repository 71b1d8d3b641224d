"""Import resolution: the local names a file's imports bind, and how the file can spell a qualified name."""

from __future__ import annotations

import ast

from canary_instrument.rewrite.syntax.nodes import statements


def bindings(node: ast.Import | ast.ImportFrom, package: list[str] | None = None):
    """(local name, qualified name, bare) for each name an import statement binds; `bare`: a plain
    `import a.b`, which binds `a`. A relative import resolves against `package` (its dotted parts)
    and binds nothing without one; a star import binds no name this can know."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.asname:
                yield alias.asname, alias.name, False
            else:
                top = alias.name.split(".")[0]
                yield top, top, True
        return
    if node.level:
        if package is None:
            return
        base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        module = ".".join([*base, *(node.module.split(".") if node.module else [])])
    else:
        module = node.module or ""
    for alias in node.names:
        if alias.name != "*":
            yield alias.asname or alias.name, f"{module}.{alias.name}" if module else alias.name, False


class Imports:
    """Local names bound by imports, resolved to qualified names (`cl` -> `contextlib`)."""

    def __init__(self, tree: ast.Module, nodes=None) -> None:
        """`nodes`: `statements(tree)`, when the caller has listed them."""
        self.names: dict[str, str] = {}
        for node in statements(tree) if nodes is None else nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for local, qualified, _ in bindings(node):
                    self.names[local] = qualified

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
