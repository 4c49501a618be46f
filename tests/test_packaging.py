"""runner as a package people can publish and install: metadata with no direct reference (PyPI refuses
them), the llama-cpp-python pin in one place, no registry's host named anywhere in the repository, and
`python -m build` + `twine check` passing. pipx and uv installs: scripts/check_install.sh (docs/install.md).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from runner import __version__
from runner.install import LLAMA_CPP_PIN

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
HOSTS = (
    "files.python" + "hosted.org",
    "pypi.python" + ".org",
    "pypi" + ".org/simple",
)  # split: not named here


def requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [
        r for extra in project["optional-dependencies"].values() for r in extra
    ]
    return [Requirement(r) for r in listed]


@pytest.mark.fast
def test_no_requirement_is_a_direct_reference() -> None:
    assert [str(r) for r in requirements() if r.url] == []
    assert "allow-direct-references" not in (ROOT / "pyproject.toml").read_text()


@pytest.mark.fast
def test_the_llama_cpp_pin_is_the_one_runner_names() -> None:
    llama = [str(r) for r in requirements() if r.name == "llama-cpp-python"]
    assert llama == [LLAMA_CPP_PIN]


def test_no_file_names_a_registry_host() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    named = [
        name
        for name in tracked.stdout.split()
        if (ROOT / name).is_file()
        and any(host in (ROOT / name).read_text(errors="replace") for host in HOSTS)
    ]
    assert named == []


def test_build_and_twine_check(tmp_path: Path) -> None:
    """An sdist and a wheel from the checkout (the wheel built from the sdist, as a registry would),
    accepted by twine; the wheel's metadata names llama-cpp-python by version, and carries models.toml
    and the chat page's static files."""
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], check=True, capture_output=True
    )
    built = sorted(p.name for p in out.iterdir())
    assert built == [f"runner-{__version__}-py3-none-any.whl", f"runner-{__version__}.tar.gz"]
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, out.iterdir())],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    wheel = next(out.glob("*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))).decode()
        assert "runner/models.toml" in archive.namelist()
        static = "runner/serve/webui/static/"  # the chat page's files ship in the wheel, nothing built
        page = {static + name for name in ("index.html", "app.js", "markdown.js", "style.css", "icon.svg")}
        assert page <= set(archive.namelist())
    requires = [
        line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")
    ]
    assert f"{LLAMA_CPP_PIN}" in requires and not any(" @ " in r for r in requires)
