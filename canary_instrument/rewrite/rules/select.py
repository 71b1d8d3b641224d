"""What a per-file rule reports, declared as data rather than looped by hand: the sites (by state) or
the problems (by kind) of a file's analysis it selects, the node each finding is at, and its message
as `check` reports it and as a transform does when it leaves the item as it is.

A rule module that is such a row holds `CODE`, `SITES` (a site state) or `PROBLEMS` (a problem kind),
`MESSAGE` and optionally `LEFT_ALONE` (templates formatted with the item as `match` or `problem`),
`AT` (the item's attribute holding the node; default `anchor` for a site, `node` for a problem) and
`INTO` (the report's list; `when_wired` holds only if some site of the tree is wired). A rule that
needs more builds `Reported` itself, or writes its own `check`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from types import ModuleType

    from canary_instrument.rewrite.findings import Finding

Message = Callable[[object], str]


@dataclass(frozen=True)
class Reported:
    """The analysed items a rule reports: `of` names the analysis' list ("sites" or "problems"),
    `which` the site state or problem kind (or a test of the item)."""

    code: str
    of: str
    which: str | Callable[[object], bool]
    message: Message
    left_alone_message: Message | None = None
    at: str = "node"
    into: str = "findings"

    @classmethod
    def of_module(cls, rule: ModuleType) -> Reported:
        """The row a rule module declares in its constants (see the module docstring)."""
        of, item = ("sites", "match") if hasattr(rule, "SITES") else ("problems", "problem")
        left_alone = getattr(rule, "LEFT_ALONE", None)
        return cls(
            rule.CODE, of, getattr(rule, of.upper()), _template(rule.MESSAGE, item),
            left_alone_message=_template(left_alone, item) if left_alone else None,
            at=getattr(rule, "AT", "anchor" if of == "sites" else "node"),
            into=getattr(rule, "INTO", "findings"),
        )

    def selected(self, parsed) -> list:
        items = getattr(parsed.analysis, self.of)
        if callable(self.which):
            return [item for item in items if self.which(item)]
        field = "state" if self.of == "sites" else "kind"
        return [item for item in items if getattr(item, field) == self.which]

    def check(self, parsed, catalog, report) -> None:
        getattr(report, self.into).extend(
            parsed.finding(getattr(item, self.at), self.code, self.message(item)) for item in self.selected(parsed)
        )

    def left_alone(self, parsed, item) -> Finding:
        """What a transform reports for `item`, which it leaves as it is."""
        return parsed.finding(getattr(item, self.at), self.code, self.left_alone_message(item))


def _template(text: str, item: str) -> Message:
    return lambda value: text.format_map({item: value})


def together(*checks: Callable) -> Callable:
    """One check running `checks` in order (a rule that reports sites, problems and hooks alike)."""

    def check(parsed, catalog, report):
        for one in checks:
            one(parsed, catalog, report)

    return check
