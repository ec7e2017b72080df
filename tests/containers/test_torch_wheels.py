"""Which torch the images' dependency stage installs, decided by real pip in a real venv without an engine.

deploy/docker/install-deps.sh runs as the Dockerfile runs it, on a wheelhouse laid out as
deploy/build-images.sh lays it out (the CPU torch in wheelhouse/, the CUDA torch in wheelhouse/cuda/),
with stand-in torch wheels of a few hundred bytes: a ``torch`` package whose ``torch.version.cuda`` says
which build it is. ``torch==2.13.0`` matches ``2.13.0+cpu`` too, and pip prefers the local version: in
one folder with both, TORCH=cuda got the CPU wheel; here it must not, and the build-time check must
stop a CPU wheel that reached the CUDA folder.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

from harness.docker_fleet import ROOT

SCRIPT = ROOT / "deploy/docker/install-deps.sh"


def stand_in_torch(folder: Path, local: str | None, cuda: str | None) -> Path:
    """A wheel of a package ``torch`` 2.13.0 (``+local``), its ``torch.version.cuda`` = ``cuda``."""
    version = "2.13.0" + (f"+{local}" if local else "")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"__version__ = {version!r}\nfrom torch import version\n",
        "torch/version.py": f"cuda = {cuda!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            whl.writestr(name, text)
    return path


def install(tmp: Path, torch: str) -> subprocess.CompletedProcess[str]:
    build = tmp / "build"
    build.mkdir(exist_ok=True)
    (build / "requirements.txt").write_text("")  # the pinned deps are not what this checks
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "RLFLEET_WHEELHOUSE": str(tmp / "wheelhouse"),
           "RLFLEET_BUILD": str(build), "HOME": str(tmp)}
    return subprocess.run(["sh", str(SCRIPT), str(tmp / f"venv-{torch}"), torch], env=env, capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL)


def installed_cuda(tmp: Path, torch: str) -> str:
    code = "import torch; print(torch.__version__, torch.version.cuda)"
    return subprocess.run([str(tmp / f"venv-{torch}" / "bin/python"), "-c", code], capture_output=True, text=True,
                          timeout=120, check=True).stdout.strip()


def test_each_torch_comes_from_its_own_folder(tmp_path: Path) -> None:
    stand_in_torch(tmp_path / "wheelhouse", "cpu", None)
    stand_in_torch(tmp_path / "wheelhouse/cuda", None, "12.8")
    for torch, want in (("cuda", "2.13.0 12.8"), ("cpu", "2.13.0+cpu None")):
        proc = install(tmp_path, torch)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert installed_cuda(tmp_path, torch) == want


def test_cuda_without_a_cuda_folder_is_refused_by_name(tmp_path: Path) -> None:
    stand_in_torch(tmp_path / "wheelhouse", "cpu", None)
    proc = install(tmp_path, "cuda")
    assert proc.returncode != 0
    assert "no torch wheel in the wheelhouse's cuda/ folder" in proc.stderr


def test_a_cpu_wheel_in_the_cuda_folder_fails_the_build(tmp_path: Path) -> None:
    stand_in_torch(tmp_path / "wheelhouse", "cpu", None)
    stand_in_torch(tmp_path / "wheelhouse/cuda", "cpu", None)
    proc = install(tmp_path, "cuda")
    assert proc.returncode != 0
    assert "TORCH=cuda: torch 2.13.0+cpu has no CUDA (torch.version.cuda is None)" in proc.stderr


def test_no_index_or_mirror_host_is_written_in_the_image_scripts() -> None:
    for name in ("deploy/build-images.sh", "deploy/docker/install-deps.sh", "Dockerfile"):
        text = (ROOT / name).read_text()
        assert "://" not in text, f"{name} names a URL"
