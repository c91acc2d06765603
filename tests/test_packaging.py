"""What the wheel ships: every source file of the mapped folders, every built-in plugin folder with
an entry point, and every built-in entry point's module.

The import packages are mapped from folders (``[tool.setuptools] package-dir``: ``jobprof`` =
``core/``, ...); setup.py lists every package under them (no hand-kept list), so a new
``plugins/<name>/`` ships as it is and needs only its entry point (``dp =
"jobprof.plugins.dp"``; tests/test_new_plugin.py adds one and runs it).  Here a wheel is built
(no isolation, no network) from a copy of the build inputs git knows, and its file list is checked
against the source folders: a folder without ``__init__.py`` or a data file no
``[tool.setuptools.package-data]`` pattern takes would install from a checkout and be absent from
the wheel.  The helpers are shared with tests/test_new_plugin.py.
"""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from conftest import REPO

PLUGINS = REPO / "plugins"


def project(root: Path = REPO) -> dict:
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))


def package_dirs(root: Path = REPO) -> dict[str, str]:
    """``{folder: import name}`` of ``[tool.setuptools] package-dir`` (``{"core": "jobprof"}``)."""
    mapping = project(root)["tool"]["setuptools"]["package-dir"]
    return {folder.strip("/"): name for name, folder in mapping.items()}


def source_files(root: Path = REPO) -> list[str]:
    """The build inputs: the top-level files and everything under the mapped folders that git
    tracks, or would (untracked files it does not ignore: works in the middle of a change)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=root, capture_output=True, check=True).stdout.decode().split("\0")
    folders = tuple(f"{folder}/" for folder in package_dirs(root))
    return sorted(path for path in set(listed) if (root / path).is_file()
                  and ("/" not in path or path.startswith(folders)))


def copy_sources(dest: Path, root: Path = REPO) -> list[str]:
    """Copy :func:`source_files` to ``dest``; returns them."""
    files = source_files(root)
    for path in files:
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / path, dest / path)
    return files


def build_wheel(tree: Path, outdir: Path) -> Path:
    """``python -m build --wheel --no-isolation`` of ``tree`` into ``outdir`` (the environment's
    setuptools: no network); returns the wheel."""
    pytest.importorskip("build")
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                           str(outdir), str(tree)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    [wheel] = outdir.glob("*.whl")
    return wheel


def wheel_path(source: str, mapping: dict[str, str]) -> str:
    """Where the source file ``source`` lands in the wheel (``core/cli/main.py`` ->
    ``jobprof/cli/main.py``): under the longest mapped folder that holds it."""
    folder = max((f for f in mapping if source.startswith(f"{f}/")), key=len)
    return "/".join((*mapping[folder].split("."), source[len(folder) + 1:]))


def wheel_entry_points(whl: zipfile.ZipFile, group: str = "jobprof") -> dict[str, str]:
    """The entry points of ``group`` in the wheel's metadata, in their order."""
    [name] = [n for n in whl.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # names keep their case
    parser.read_string(whl.read(name).decode())
    return dict(parser[group]) if parser.has_section(group) else {}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], set[str], dict[str, str]]:
    """The source files, and the file names and ``jobprof`` entry points of a wheel built from them."""
    tree = tmp_path_factory.mktemp("source")
    files = copy_sources(tree)
    with zipfile.ZipFile(build_wheel(tree, tmp_path_factory.mktemp("dist"))) as whl:
        return files, set(whl.namelist()), wheel_entry_points(whl)


def test_the_wheel_ships_every_source_file_of_the_mapped_folders(wheel):
    files, names, _ = wheel
    mapping = package_dirs()
    expected = {wheel_path(path, mapping) for path in files if "/" in path}
    missing = sorted(expected - names)
    assert not missing, ("source files absent from the wheel (a folder without __init__.py, or a data "
                         f"file no [tool.setuptools.package-data] pattern takes): {missing}")
    # and nothing else but the metadata and the .pth file setup.py adds
    extra = sorted(n for n in names - expected if ".dist-info/" not in n and n != "jobprof-autoload.pth")
    assert not extra, f"files in the wheel that are no source file: {extra}"


def test_every_builtin_plugin_folder_is_shipped_and_registered(wheel):
    _, names, shipped = wheel
    entry_points = project()["project"]["entry-points"]["jobprof"]
    folders = sorted(p.name for p in PLUGINS.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    assert folders, "no plugin folders found"
    registered = {value.split(":")[0].split(".")[2] for value in entry_points.values()
                  if value.startswith("jobprof.plugins.")}
    for name in folders:
        assert f"jobprof/plugins/{name}/__init__.py" in names, f"plugins/{name} is not in the wheel"
        assert name in registered, f"plugins/{name} has no entry point"
    assert shipped == entry_points, "the wheel's entry points are not pyproject's"


def test_every_builtin_entry_point_module_is_in_the_wheel(wheel):
    _, names, _ = wheel
    entry_points = project()["project"]["entry-points"]["jobprof"]
    assert entry_points
    for name, value in entry_points.items():
        module = value.split(":")[0]
        assert module.startswith("jobprof.plugins."), f"entry point {name}: {module} is not a built-in plugin"
        path = module.replace(".", "/")
        assert {f"{path}/__init__.py", f"{path}.py"} & names, \
            f"entry point {name}: {module} is not in the wheel"
