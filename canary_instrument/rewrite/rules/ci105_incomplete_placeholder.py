"""CI105 incomplete-placeholder.

Reports: incomplete placeholder: `with canary_ctx` without its assignment, or an assignment that is neither the
placeholder factory nor generated wiring (hand-written code; the tool leaves it alone)

Why: A bracket without its assignment does not run, and an assignment the tool did not write is not its to
change: apply leaves both alone.

Fix: make it a placeholder
"""

from canary_instrument.rewrite.findings import INCOMPLETE_PLACEHOLDER as CODE
from canary_instrument.rewrite.rules.select import Reported, together

OTHER = Reported(
    CODE, "sites", "other", at="anchor",
    message=lambda match: f"{match.site.role} site in {match.where}: `{match.placeholder}` holds neither a "
    "placeholder nor generated wiring",
    left_alone_message=lambda match: f"{match.site.role} site: `{match.placeholder}` holds code that is neither a "
    "placeholder nor wiring; left alone (make it a placeholder to let the tool manage it)",
)
UNASSIGNED = Reported(
    CODE, "problems", "incomplete",
    message=lambda problem: f"`{problem.name}` is used but never assigned",
    left_alone_message=lambda problem: f"`{problem.name}` is used but never assigned; add "
    f"`{problem.name} = contextlib.nullcontext()` before it",
)
check = together(OTHER.check, UNASSIGNED.check)


def left_alone(parsed) -> list:
    """What a transform reports for incomplete placeholders, which it leaves as they are."""
    return [rule.left_alone(parsed, item) for rule in (UNASSIGNED, OTHER) for item in rule.selected(parsed)]
