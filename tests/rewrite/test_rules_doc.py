"""The rules' documentation: one module per finding code, and docs/cli.md's table generated from them."""

from __future__ import annotations

from pathlib import Path

from canary_instrument.rewrite import findings
from canary_instrument.rewrite.rules import RULES, doc

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_table_is_the_one_generated_from_the_rules():
    text = DOCS.read_text(encoding="utf-8")
    assert doc.replace_table(text) == text, "run `python -m canary_instrument.rewrite.rules.doc`"


def test_every_finding_code_has_one_rule_in_code_order_with_its_docs():
    codes = sorted(value for name, value in vars(findings).items() if name.isupper() and isinstance(value, str)
                   and value.startswith("CI") and value < "CI900")
    assert [rule.CODE for rule in RULES] == codes
    for rule in RULES:
        assert rule.__doc__.startswith(rule.CODE + " ")
        assert set(doc.sections(rule.__doc__)) == {"Reports", "Why", "Fix"}, rule.__name__


def test_a_changed_rule_doc_makes_the_table_differ(tmp_path, monkeypatch):
    stale = tmp_path / "cli.md"
    stale.write_text(DOCS.read_text(encoding="utf-8").replace("stale wiring", "old wiring"), encoding="utf-8")
    assert doc.main([str(stale), "--check"]) == 1
    assert doc.main([str(stale)]) == 0
    assert stale.read_text(encoding="utf-8") == DOCS.read_text(encoding="utf-8")
