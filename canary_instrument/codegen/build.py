"""Render every kernel specialisation into kernels/, writing only files whose bytes changed.

``setup.py`` calls ``render_kernels`` before packaging; ``build-kernels`` calls it on demand.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .render import GENERATOR, environment, render_spec
from .specs import FAMILIES, every_spec

MANIFEST = "manifest.json"
INIT = "__init__.py"


@dataclass
class BuildResult:
    written: list[str] = field(default_factory=list)  # files whose content changed (or would change)
    removed: list[str] = field(default_factory=list)  # generated files no specialisation produces any more
    unchanged: list[str] = field(default_factory=list)

    @property
    def stale(self) -> list[str]:
        return self.written + self.removed


def _write_if_different(path: Path, text: str, check: bool) -> bool:
    try:
        if path.read_text(encoding="utf-8") == text:
            return False
    except (OSError, UnicodeDecodeError):
        pass
    if not check:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return True


def expected_files(templates_dir, layouts=None) -> dict[str, str]:
    """File name -> exact content of every generated file (kernels, manifest, package init)."""
    templates_dir = Path(templates_dir)
    env = environment(templates_dir)
    everything = [render_spec(env, templates_dir, spec, spec.template) for spec in every_spec()]
    chosen = {s.filename for s in every_spec(layouts)} if layouts else None
    files = {r.spec.filename: r.text for r in everything if chosen is None or r.spec.filename in chosen}
    manifest = {
        r.spec.filename: {"template": r.spec.template, "axes": r.spec.axes, "template_sha256": r.template_sha,
                          "content_sha256": r.content_sha}
        for r in everything
    }
    files[MANIFEST] = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    files[INIT] = (
        f'"""Triton canary kernels rendered from templates/ by `{GENERATOR}`; do not edit.\n\n'
        f'{MANIFEST} lists every file with its specialisation axes and content hash.\n"""\n'
    )
    return files


def render_kernels(templates_dir, out_dir, layouts=None, check: bool = False) -> BuildResult:
    """Bring ``out_dir`` up to date (or, with ``check``, only report what is stale)."""
    out = Path(out_dir)
    if not check:
        out.mkdir(parents=True, exist_ok=True)
    result = BuildResult()
    files = expected_files(templates_dir, layouts)
    for name, text in sorted(files.items()):
        (result.written if _write_if_different(out / name, text, check) else result.unchanged).append(name)
    if not layouts and out.is_dir():
        for orphan in sorted(p for family in FAMILIES for p in out.glob(f"{family}_*.py")):
            if orphan.name not in files:
                result.removed.append(orphan.name)
                if not check:
                    orphan.unlink()
    return result
