"""The wheel: `python -m build` makes one holding the three packages, and installed with an
extra into a fresh virtualenv (the way README.md says, `pip install './dist/….whl[X]'`) it
gives working `sessiond` and `sessionctl` commands and `import sessiond`.

Offline: the wheel is built with `--no-isolation` (hatchling and build come with the
`test` extra), and the fresh venv sees this run's site-packages through a `.pth` file, so
pip resolves the wheel's dependencies and extras from what is installed here (`--no-index`)
instead of downloading them. The checkout's own code is kept out of the new venv: no
PYTHONPATH, and the `.pth` adds the directory alone (the editable install's path hooks in
it are not run), so what is imported is the wheel's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
import time
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = ("sessiond", "sessiond_daemon", "sessiond_schemas")

pytest.importorskip("build", reason="`build` is in the `test` extra")
pytest.importorskip("hatchling", reason="`hatchling` is in the `test` extra")


def run(argv: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env,
                          timeout=600, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def wheel() -> Iterator[Path]:
    """A wheel built from this checkout by `python -m build`."""
    with tempfile.TemporaryDirectory(prefix="sd-whl-") as out:
        run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", out,
             ROOT])
        [built] = Path(out).glob("sessiond-*.whl")
        yield built


@pytest.fixture(scope="module")
def installed(wheel: Path) -> Iterator[Path]:
    """A fresh venv with the wheel installed, `[metrics,fleet]` extras resolved; its bin/."""
    with tempfile.TemporaryDirectory(prefix="sd-venv-") as where:
        env_dir = Path(where) / "venv"
        venv.create(env_dir, with_pip=False)
        site = Path(sysconfig.get_path("purelib", vars={"base": str(env_dir),
                                                         "platbase": str(env_dir)}))
        ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
        (site / "test-run-site.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
        python = env_dir / "bin" / "python"
        run([sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
             "--no-index", f"{wheel}[metrics,fleet]"])
        yield env_dir / "bin"


def test_wheel_holds_the_three_packages(wheel: Path) -> None:
    """Client, daemon and schemas, each typed (py.typed), with the two console scripts."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = z.read(entry_points).decode()
    for package in PACKAGES:
        assert f"{package}/__init__.py" in names, package
        assert f"{package}/py.typed" in names, package
    assert "sessiond/cli.py" in names and "sessiond_daemon/__main__.py" in names
    assert "sessiond = sessiond_daemon.__main__:main" in scripts
    assert "sessionctl = sessiond.cli:main" in scripts
    assert not [n for n in names if n.startswith(("tests/", "bench/"))]


def test_installed_wheel_imports_and_runs(installed: Path) -> None:
    """`import sessiond` is the wheel's; `sessiond --help` and `sessionctl --help` work."""
    shown = run([installed / "python", "-c",
                 "import sessiond, sessiond_daemon, sessiond_schemas, sessiond.integrations\n"
                 "for m in (sessiond, sessiond_daemon, sessiond_schemas): print(m.__file__)"])
    venv_dir = installed.parent.resolve()
    for line in shown.stdout.split():
        assert Path(line).resolve().is_relative_to(venv_dir), shown.stdout
    assert "usage: sessiond" in run([installed / "sessiond", "--help"]).stdout
    assert "usage: sessionctl" in run([installed / "sessionctl", "--help"]).stdout


def test_installed_commands_serve_and_answer(installed: Path) -> None:
    """The wheel's daemon serves and its sessionctl talks to it: create, then show."""
    with tempfile.TemporaryDirectory(prefix="sd-") as d:
        sock = os.path.join(d, "s.sock")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        daemon = subprocess.Popen([installed / "sessiond", "--socket", sock, "--db",
                                   os.path.join(d, "s.db"), "--log-level", "warning"], env=env)
        try:
            while not os.path.exists(sock):  # pacing while it starts, not a bound under test
                assert daemon.poll() is None, "the wheel's daemon exited"
                time.sleep(0.02)
            created = run([installed / "sessionctl", "--socket", sock, "create",
                           "--id", "from-wheel", "--task", "packaged"])
            assert "from-wheel" in created.stdout
            shown = run([installed / "sessionctl", "--socket", sock, "--json", "show",
                         "from-wheel"])
            assert '"task": "packaged"' in shown.stdout or '"task":"packaged"' in shown.stdout
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)


def test_the_readme_names_the_wheel_that_is_built(wheel: Path) -> None:
    """README.md's install line names the file `python -m build` makes (its version)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"pip install './dist/{wheel.name}[metrics]'" in readme
