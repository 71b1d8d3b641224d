"""`canary-instrument build-kernels`: render templates/ into kernels/, or check they are fresh.

Imports nothing heavy at module import; jinja2 is loaded only when the command runs.
"""

from __future__ import annotations

from pathlib import Path

import click

LAYOUT_CHOICES = ("mha", "mla", "swa")


def default_dirs() -> tuple[Path, Path]:
    """templates/ and kernels/ of the source checkout, else the copies shipped in the package."""
    package = Path(__file__).resolve().parent.parent
    repo = package.parent
    if (repo / "templates").is_dir():
        return repo / "templates", repo / "kernels"
    return package / "_templates", package / "kernels"


@click.command("build-kernels")
@click.option("--layout", "layouts", multiple=True, type=click.Choice(LAYOUT_CHOICES),
              help="Only these layouts' kernel files (repeatable); default all.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if any generated file is stale.")
@click.option("--templates", "templates_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Template folder (default: the checkout's templates/).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Output folder (default: the checkout's kernels/).")
def build_kernels(layouts, check, templates_dir, out_dir):
    """Render the Jinja kernel templates into per-layout Triton kernels."""
    from .build import render_kernels
    from .render import KernelTemplateError

    default_templates, default_out = default_dirs()
    templates_dir = templates_dir or default_templates
    out_dir = out_dir or default_out
    try:
        result = render_kernels(templates_dir, out_dir, layouts=list(layouts) or None, check=check)
    except KernelTemplateError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2)
    if check:
        for name in result.stale:
            click.echo(f"{out_dir / name}: stale; run `canary-instrument build-kernels` and commit the result")
        if result.stale:
            raise SystemExit(1)
        return
    for name in result.written:
        click.echo(f"wrote {out_dir / name}")
    for name in result.removed:
        click.echo(f"removed {out_dir / name}")
