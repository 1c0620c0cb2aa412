"""`pip install gpulab` is enough for JupyterLab: the wheel carries the prebuilt
lab extension and switches the server extension on."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

from tests.support import REPO

STATIC = REPO / "labextension" / "labextension_static"


def test_wheel_ships_the_prebuilt_extension_and_server_switch(tmp_path):
    assert (STATIC / "package.json").exists(), "run labextension/build.sh (scripts/bootstrap.sh does)"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("gpulab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    data = f"gpulab-{wheel.name.split('-')[1]}.data/data/"
    ext = data + "share/jupyter/labextensions/gpulab-labextension/"
    assert ext + "package.json" in names
    assert any(n.startswith(ext + "static/remoteEntry.") for n in names)
    assert data + "etc/jupyter/jupyter_server_config.d/gpulab.json" in names
    assert "labextension/handlers.py" in names
    assert not [n for n in names if n.startswith("labextension/src/") or "node_modules" in n]

    # Install into a fresh, empty virtualenv (pip --python): never into the
    # repo's .venv, where pip would first uninstall its editable gpulab.
    prefix = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=120)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(prefix / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    assert list(prefix.glob("lib/python3*/site-packages/labextension/handlers.py"))
    meta = json.loads((prefix / "share/jupyter/labextensions/gpulab-labextension/package.json").read_text())
    assert meta["name"] == "gpulab-labextension"
    assert meta["jupyterlab"]["_build"]["load"].startswith("static/remoteEntry.")
    conf = json.loads((prefix / "etc/jupyter/jupyter_server_config.d/gpulab.json").read_text())
    assert conf == {"ServerApp": {"jpserver_extensions": {"labextension": True}}}
