"""Build hook: render the Jinja kernel templates into kernels/ before packaging.

Metadata lives in pyproject.toml; this file only maps the shipped data folders
(kernels/, templates/, the reference engine) into the package and runs codegen
for wheel and editable builds alike.
"""

import os
import sys

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))

# Folders shipped inside the installed package under another name
# (kernels/ must not become an importable top-level package).
MAPPED = {
    "canary_instrument.kernels": "kernels",
    "canary_instrument._templates": "templates",
    "canary_instrument._engine": "golden/engine",
}


def _packages():
    packages = find_packages(include=["canary_instrument", "canary_instrument.*"])
    package_dir = {}
    for name, folder in MAPPED.items():
        package_dir[name] = folder
        packages.append(name)
        for sub in find_packages(where=os.path.join(HERE, folder)):
            packages.append(f"{name}.{sub}")
            package_dir[f"{name}.{sub}"] = os.path.join(folder, *sub.split("."))
    return packages, package_dir


class RenderKernelsThenBuild(build_py):
    """Render templates/ into kernels/ (write-if-different), then build as usual."""

    def run(self):
        sys.path.insert(0, HERE)
        try:
            from canary_instrument.codegen.build import render_kernels

            render_kernels(os.path.join(HERE, "templates"), os.path.join(HERE, "kernels"))
        finally:
            sys.path.remove(HERE)
        super().run()


packages, package_dir = _packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={
        "canary_instrument.catalog": ["*.toml"],
        "canary_instrument.kernels": ["*.py", "*.json"],
        "canary_instrument._templates": ["*.jinja", "**/*.jinja"],
        "canary_instrument._engine": ["**/*.py"],
    },
    cmdclass={"build_py": RenderKernelsThenBuild},
)
