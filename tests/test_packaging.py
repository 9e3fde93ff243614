"""A normal (non-editable) install ships every module under its public name.

setuptools' ``package-dir`` maps ``server/`` to ``fscache.server`` and ``client/``
to ``fscache.client``; a subpackage missing from the list would import fine from
an editable checkout and be absent from a real install. So: build a wheel, unpack
it into an empty directory, and import every module from there alone.

The wheel is built from a copy of the checkout: setuptools builds in the source tree
(``build/``, ``*.egg-info``), and under pytest-xdist each worker that runs a test here
builds its own wheel, perhaps at the same moment as another.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = {"fscache": "fscache", "fscache.server": "server", "fscache.client": "client",
            "fscache.bench": "bench"}  # fmt: skip
# Not copied for the build: what builds, installs and tools leave in a checkout.
BUILD_LEFTOVERS = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache",
                   ".hypothesis")  # fmt: skip


def expected_modules() -> list[str]:
    modules = []
    for package, folder in PACKAGES.items():
        for source in sorted((REPO / folder).glob("*.py")):
            stem = source.stem
            if stem == "__main__":  # importing it runs the command
                continue
            modules.append(package if stem == "__init__" else f"{package}.{stem}")
    return modules


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> pathlib.Path:
    source = tmp_path_factory.mktemp("source") / "fscache"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if build.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{build.stdout}\n{build.stderr}")
    (wheel,) = out.glob("fscache-*.whl")
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(target)
    return target


def test_a_normal_install_imports_every_module(installed):
    modules = expected_modules()
    assert "fscache.server.service" in modules and "fscache.client.blocking" in modules
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(installed)!r}), (name, module.__file__)\n"
        "import fscache\n"
        "assert callable(fscache.open_client) and callable(fscache.connect)\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(installed)!r})\n"
         + script],
        capture_output=True, text=True, cwd=installed, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_the_console_script_is_declared(installed):
    (entry_points,) = installed.glob("fscache-*.dist-info/entry_points.txt")
    assert "fscache = fscache.command:main" in entry_points.read_text()
