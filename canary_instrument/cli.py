"""The `canary-instrument` command line: parse, call the rewriter, print, exit (0 clean, 1 findings, 2 errors).

Only click and the standard library load at start-up; libcst loads for the transforms, and the
`build-kernels` and `demo` commands (jinja, torch) load only when invoked or listed in help.
"""

from __future__ import annotations

import importlib
import sys

import click

from canary_instrument import __version__

# Commands other parts of the package provide: name -> (module, attribute).
LAZY_COMMANDS = {
    "build-kernels": ("canary_instrument.codegen.command", "build_kernels"),
    "demo": ("canary_instrument.demo.command", "demo"),
}


class LazyGroup(click.Group):
    """A group whose heavy commands are imported only when invoked (or when help lists them)."""

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx, name):
        command = super().get_command(ctx, name)
        if command is not None or name not in LAZY_COMMANDS:
            return command
        try:
            return self._load(name)
        except ImportError:
            return None  # listed in help without its summary; resolve_command says why

    def resolve_command(self, ctx, args):
        name = args[0] if args else None
        if name in LAZY_COMMANDS and super().get_command(ctx, name) is None:
            try:
                self._load(name)
            except ImportError as error:
                raise click.UsageError(f"`{name}` is unavailable: {error}", ctx) from None
        return super().resolve_command(ctx, args)

    def _load(self, name):
        module_name, attribute = LAZY_COMMANDS[name]
        command = getattr(importlib.import_module(module_name), attribute)
        self.add_command(command, name)
        return command


def _load_catalog(paths, catalog_file):
    from canary_instrument.catalog import CatalogError, load_catalog

    try:
        return load_catalog(paths[0] if paths else ".", catalog_file)
    except CatalogError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2)


def _fail_on_internal_error(function, *args, **kwargs):
    """Run a rewriter call; an unexpected exception is exit 2 with one line, not a traceback."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the CLI's last line of defence
        click.echo(f"error: internal error: {type(error).__name__}: {error} (please report this)", err=True)
        sys.exit(2)


PATHS = click.argument("paths", nargs=-1, type=click.Path(), metavar="[PATH]...")
CATALOG = click.option(
    "--catalog", "catalog_file", type=click.Path(dir_okay=False),
    help="Catalog overlay file (TOML, same format as [tool.canary-instrument]).",
)
QUIET = click.option("-q", "--quiet", is_flag=True, help="Print only findings and errors.")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="canary-instrument")
def main():
    """Instrument an LLM serving engine with KV-cache canaries.

    Typical flow: `scaffold` (no-op placeholders), `check` (pre-commit gate),
    `apply` (generated wiring), `revert` (back to placeholders).
    """


@main.command()
@PATHS
@CATALOG
@click.option(
    "--format", "output_format", type=click.Choice(["text", "json", "github"]), default="text",
    show_default=True, help="text: path:line:col lines; json: one document; github: workflow annotations.",
)
@click.option("--no-cache", is_flag=True, help="Read and analyse every file; neither read nor write the cache.")
@click.option(
    "--cache-dir", type=click.Path(file_okay=False), envvar="CANARY_INSTRUMENT_CACHE_DIR",
    help="Cache folder (default: .canary-instrument-cache at the git root; env CANARY_INSTRUMENT_CACHE_DIR).",
)
def check(paths, catalog_file, output_format, no_cache, cache_dir):
    """Check that every catalogued site holds a placeholder or its wiring, nothing is stray or half-wired,
    and no forward path runs outside every catalogued site. Exit 0 clean, 1 findings, 2 errors."""
    from canary_instrument.rewrite.io.cache import CheckCache
    from canary_instrument.rewrite.check import check_tree

    paths = paths or (".",)
    catalog = _load_catalog(paths, catalog_file)
    cache = None if no_cache else CheckCache.open(paths, catalog, cache_dir)
    result = _fail_on_internal_error(check_tree, paths, catalog, cache=cache)
    diagnostics = [*result.errors, *result.findings]
    if output_format == "json":
        import json  # here, not at the top: the default text output does not need it

        click.echo(json.dumps({
            "findings": [f.as_dict() for f in result.findings],
            "errors": [
                {"path": str(e.path), "line": e.line, "col": e.col, "code": e.code, "message": e.message}
                for e in result.errors
            ],
            "files_seen": result.files_seen,
            "files_analysed": result.files_analysed,
            "exit_code": result.exit_code,
        }, indent=2))
    elif output_format == "github":
        for item in diagnostics:
            path = _escape_property(str(item.path))
            message = _escape_data(item.message)
            click.echo(f"::error file={path},line={item.line},col={item.col},title={item.code}::{message}")
    else:
        for item in diagnostics:
            click.echo(str(item))
        if diagnostics:
            click.echo("Found " + _summary_counts(result) + f" ({result.files_seen} files, {result.files_analysed} analysed).")
    sys.exit(result.exit_code)


def _escape_data(text: str) -> str:
    """GitHub workflow-command escaping of a message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """GitHub workflow-command escaping of a property value (file=...)."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _summary_counts(result) -> str:
    parts = []
    if result.findings:
        parts.append(f"{len(result.findings)} finding{'s' * (len(result.findings) != 1)}")
    if result.errors:
        parts.append(f"{len(result.errors)} file error{'s' * (len(result.errors) != 1)}")
    return " and ".join(parts)


def _transform_command(name, verb, past, description):
    @main.command(name=name, help=description)
    @PATHS
    @CATALOG
    @click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff; write nothing.")
    @click.option("--check", "check_only", is_flag=True, help="Write nothing; exit 1 if anything would change.")
    @QUIET
    def command(paths, catalog_file, show_diff, check_only, quiet):
        module_name, function_name = _TRANSFORMS[name]
        function = getattr(importlib.import_module(module_name), function_name)
        paths = paths or (".",)
        catalog = _load_catalog(paths, catalog_file)
        write = not (show_diff or check_only)
        result = _fail_on_internal_error(function, paths, catalog, write=write)
        if show_diff:
            for change in result.changes:
                click.echo(change.diff(), nl=False)
        for item in [*result.errors, *result.findings]:
            click.echo(str(item), err=True)
        if not quiet:
            for change in result.changes:
                label = past if write else f"would {verb}"
                click.echo(f"{label} {change.path} ({change.sites} site{'s' * (change.sites != 1)})", err=True)
            if result.changes or result.findings or result.errors:
                done = past if write else f"would be {past}"
                line = f"{len(result.changes)} file{'s' * (len(result.changes) != 1)} {done}"
                if result.findings or result.errors:
                    line += "; " + _summary_counts(result)
                click.echo(line + ".", err=True)
        code = result.exit_code
        if code == 0 and check_only and result.changes:
            code = 1
        sys.exit(code)

    return command


_TRANSFORMS = {
    "scaffold": ("canary_instrument.rewrite.transforms.scaffold", "scaffold_tree"),
    "apply": ("canary_instrument.rewrite.transforms.apply", "apply_tree"),
    "revert": ("canary_instrument.rewrite.transforms.revert", "revert_tree"),
}
scaffold = _transform_command(
    "scaffold", "scaffold", "scaffolded",
    "Insert no-op placeholders (`canary_ctx = contextlib.nullcontext()` + `with canary_ctx:`) at every "
    "catalogued site. Refuses any file whose output minus the placeholders is not AST-identical to its input.",
)
apply = _transform_command(
    "apply", "apply", "applied",
    "Replace placeholders with generated wiring: one `canary_ctx` member per class, a one-line change per "
    "site, the install and init-finished hooks and the runtime imports. Idempotent.",
)
revert = _transform_command(
    "revert", "revert", "reverted",
    "Undo `apply`: wiring back to placeholders; generated members, hooks and imports removed.",
)
