"""Container images with no registry: built here with buildah, cached by content,
imported into the node's containerd.

- ``python:3.11-slim`` (also tagged ``-bookworm``): a stand-in for the official image,
  Debian bookworm's Python 3.11 from ``debootstrap --variant=minbase``;
- ``busybox:1.36``: Debian's static busybox;
- the pause image: ``build/pause/linux/pause.c`` of the k8s.io/kubernetes module, static;
- the operator image: the repository's Dockerfile, unchanged;
- the Ray image: the same Dockerfile's ``raycluster`` target, on a stand-in for
  ``rayproject/ray:<RAY_VERSION>-py311`` (no registry here): the Python stand-in above
  plus ``ray[default]`` at the Dockerfile's RAY_VERSION and the wget KubeRay's probes
  run.  Same Python and Ray as the operator image, which a Ray Client driver needs.

Each image is keyed by a hash of what it is made from (its recipe, its base's key,
and for the project's images the Dockerfile, pyproject.toml and sources); its
``docker save`` archive is kept under the cache as ``<name>-<key>.tar``, so a warm
run builds only what changed.  buildah keeps its own storage under the cache too.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

Log = Callable[[str], None]
REPO = Path(__file__).resolve().parents[4]
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"   # kubelet 1.34's default sandbox image
RECIPE_VERSION = "1"                            # bump to rebuild every image


class ImageError(RuntimeError):
    pass


def digest(*parts: bytes | str) -> str:
    hasher = hashlib.sha256(RECIPE_VERSION.encode())
    for part in parts:
        hasher.update(part.encode() if isinstance(part, str) else part)
        hasher.update(b"\0")
    return hasher.hexdigest()[:16]


def _in_build_context(path: Path) -> bool:
    # what .dockerignore leaves out: `pip install -e` rewrites the egg-info, which must not
    # rebuild the images (it did: every `make unit` after a pyproject.toml change)
    return not any(part == "__pycache__" or part.endswith(".egg-info") for part in path.parts) \
        and path.suffix != ".pyc"


def tree_digest(root: Path, paths: Iterable[str]) -> str:
    """A hash of the named files and of every file under the named directories."""
    hasher = hashlib.sha256()
    for name in paths:
        path = root / name
        files = [path] if path.is_file() else sorted(
            p for p in path.rglob("*") if p.is_file() and _in_build_context(p.relative_to(root)))
        for file in files:
            hasher.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    return hasher.hexdigest()[:16]


@dataclass
class Image:
    name: str                       # what pods name (``python:3.11-slim``)
    key: str
    build: Callable[["Builder", "Image"], None]
    tags: list[str] = field(default_factory=list)    # more names for the same image
    parents: list["Image"] = field(default_factory=list)

    @property
    def family(self) -> str:
        """The name without its tag: a newer build of the same family replaces the older."""
        return self.name.rsplit(":", 1)[0].replace("/", "_")


class Builder:
    """buildah with kubetune's own storage under ``cache``."""

    def __init__(self, cache: Path, log: Log = print):
        self.cache = cache
        self.archives = cache / "archives"
        self.archives.mkdir(parents=True, exist_ok=True)
        self.log = log

    def buildah(self, *args: str, timeout: float = 1800, **kwargs) -> str:
        argv = ["buildah", "--root", str(self.cache / "storage"), "--runroot", str(self.cache / "run"),
                "--storage-driver", "overlay", *args]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
        if result.returncode != 0:
            raise ImageError(f"{' '.join(argv[7:9])}... failed ({result.returncode}):\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
        return result.stdout.strip()

    def remove(self, container: str) -> None:
        """Drop a working container (best effort: it only holds a finished or failed build)."""
        subprocess.run(["buildah", "--root", str(self.cache / "storage"), "--runroot", str(self.cache / "run"),
                        "--storage-driver", "overlay", "rm", container], capture_output=True)

    def archive(self, image: Image) -> Path:
        return self.archives / f"{image.family}-{image.key}.tar"

    def present(self, name: str) -> bool:
        result = subprocess.run(["buildah", "--root", str(self.cache / "storage"), "--runroot",
                                 str(self.cache / "run"), "--storage-driver", "overlay",
                                 "inspect", "--type", "image", name], capture_output=True)
        return result.returncode == 0

    def ensure(self, image: Image) -> Path:
        """The image's archive, built (with its parents) if this key has none yet."""
        archive = self.archive(image)
        if archive.exists():
            return archive
        import fcntl
        with open(self.archives / f".{image.family}.lock", "w") as lock:   # one build per image at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            return archive if archive.exists() else self._build(image, archive)

    def _build(self, image: Image, archive: Path) -> Path:
        for parent in image.parents:
            parent_archive = self.ensure(parent)
            if not self.present(self.local(parent)):
                self.buildah("pull", "--quiet", f"docker-archive:{parent_archive}")
        started = time.monotonic()
        self.log(f"images: building {image.name} ({image.key})")
        image.build(self, image)
        for tag in image.tags:
            self.buildah("tag", self.local(image), tag)
        tmp = archive.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        self.buildah("push", "--quiet", self.local(image), f"docker-archive:{tmp}:{image.name}")
        # the extra tags ride in the same archive: one import gives pods every name
        if image.tags:
            self._add_tags(tmp, image.tags)
        os.replace(tmp, archive)
        for stale in self.archives.glob(f"{image.family}-*.tar"):
            family, key = stale.stem.rsplit("-", 1)
            if stale != archive and family == image.family:
                stale.unlink()
                self._remove_images(family, key)
        self.buildah("rmi", "--prune")    # the layers of replaced builds
        self.log(f"images: built {image.name} in {time.monotonic() - started:.0f}s")
        return archive

    def _remove_images(self, family: str, key: str) -> None:
        """Drop a replaced build of ``family`` (tagged ``...<key>``) from buildah's storage:
        a new key per change of the code would otherwise keep every old image there."""
        try:    # best effort: a build of another family may change the list meanwhile
            listed = self.buildah("images", "--format", "{{.Name}}:{{.Tag}}")
            for name in listed.splitlines():
                repository, _, tag = name.rpartition(":")
                if repository.rsplit("/", 1)[-1] == family and tag.endswith(key):
                    self.buildah("rmi", "--force", name)
        except ImageError as error:
            self.log(f"images: {family} {key} left in storage: {error}")

    @staticmethod
    def local(image: Image) -> str:
        return image.name if "/" in image.name.split(":")[0] else f"localhost/{image.name}"

    @staticmethod
    def _add_tags(archive: Path, tags: list[str]) -> None:
        import tarfile
        with tarfile.open(archive) as tar:
            manifest = json.load(tar.extractfile("manifest.json"))
            members = {m.name: tar.extractfile(m).read() if m.isfile() else None for m in tar.getmembers()}
            infos = {m.name: m for m in tar.getmembers()}
        manifest[0]["RepoTags"] = list(manifest[0].get("RepoTags") or []) + tags
        data = json.dumps(manifest).encode()
        rewritten = archive.with_suffix(".retag")
        import io
        with tarfile.open(rewritten, "w") as out:
            for name, info in infos.items():
                if name == "manifest.json":
                    info.size = len(data)
                    out.addfile(info, io.BytesIO(data))
                else:
                    out.addfile(info, io.BytesIO(members[name]) if members[name] is not None else None)
        os.replace(rewritten, archive)


# ---------------------------------------------------------------- recipes

PYTHON_PACKAGES = "python3,python3-venv,python3-pip,ca-certificates,passwd"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def _python_base(builder: Builder, image: Image) -> None:
    container = builder.buildah("from", "scratch")
    try:
        root = Path(builder.buildah("mount", container))
        subprocess.run(["debootstrap", "--variant=minbase", f"--include={PYTHON_PACKAGES}", "bookworm",
                        str(root), DEBIAN_MIRROR], check=True, capture_output=True, timeout=1800)
        # a plain `pip install` as in the official image (no Debian-managed environment)
        for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
            marker.unlink()
        for name, target in (("python", "/usr/bin/python3"), ("python3", "/usr/bin/python3"),
                             ("pip", "/usr/bin/pip3"), ("pip3", "/usr/bin/pip3")):
            link = root / "usr/local/bin" / name
            link.unlink(missing_ok=True)
            link.symlink_to(target)
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
        # this machine's trust store: image builds (pip) reach the package index through
        # whatever TLS proxy the machine trusts; every pip (also a venv's) is pointed at it
        shutil.copyfile(HOST_CA_BUNDLE, root / HOST_CA_BUNDLE.relative_to("/"))
        builder.buildah("config", "--env", "PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                        "--env", "LANG=C.UTF-8", *(arg for name in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
                                                  for arg in ("--env", f"{name}={HOST_CA_BUNDLE}")),
                        "--cmd", "python3", container)
        builder.buildah("commit", "--quiet", container, builder.local(image))
    finally:
        builder.remove(container)


def _from_files(files: dict[str, tuple[Path, int]], links: dict[str, str], entrypoint: list[str]):
    """An image of a few files (path in image -> (source, mode)) and symlinks."""
    def build(builder: Builder, image: Image) -> None:
        container = builder.buildah("from", "scratch")
        try:
            root = Path(builder.buildah("mount", container))
            for path, (source, mode) in files.items():
                target = root / path.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
                target.chmod(mode)
            for path, target in links.items():
                link = root / path.lstrip("/")
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(target)
            (root / "tmp").mkdir(mode=0o1777, exist_ok=True)
            builder.buildah("config", "--entrypoint", json.dumps(entrypoint), container)
            builder.buildah("commit", "--quiet", container, builder.local(image))
        finally:
            builder.remove(container)
    return build


def pause_source() -> Path:
    from kubetune.devcluster.build import kubernetes_version
    gomodcache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True).stdout.strip()
    source = Path(gomodcache) / f"k8s.io/kubernetes@{kubernetes_version()}" / "build/pause/linux/pause.c"
    if not source.exists():
        raise ImageError(f"{source} is missing: build the node binaries first (they download the module)")
    return source


def pause_image(work: Path) -> Image:
    source = pause_source()
    binary = work / "pause"

    def build(builder: Builder, image: Image) -> None:
        subprocess.run(["gcc", "-Os", "-static", "-o", str(binary), str(source)], check=True, capture_output=True)
        _from_files({"/pause": (binary, 0o755)}, {}, ["/pause"])(builder, image)
    return Image(PAUSE_IMAGE, digest(source.read_bytes()), build)


def _shared_libraries(binary: Path) -> dict[str, tuple[Path, int]]:
    """The libraries ``binary`` loads (ldd), each at its own path."""
    listed = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    paths = [part for line in listed.splitlines() for part in line.split() if part.startswith("/")]
    return {path: (Path(path).resolve(), 0o755) for path in paths}


def busybox_image() -> Image:
    """A stand-in from Debian's binaries: the static busybox's applets, with mawk as
    ``awk`` and dash as ``sh``.  Debian builds busybox's awk without floating-point math
    (``^``, used by examples/pod-stdout.yaml), and its shell would run that applet
    whatever PATH says."""
    busybox, mawk, dash = Path("/bin/busybox"), Path("/usr/bin/mawk").resolve(), Path("/usr/bin/dash")
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    files = {"/bin/busybox": (busybox, 0o755), "/usr/bin/mawk": (mawk, 0o755), "/usr/bin/dash": (dash, 0o755),
             **_shared_libraries(mawk), **_shared_libraries(dash)}
    links = {f"/bin/{applet}": "busybox" for applet in applets if applet not in ("busybox", "awk", "sh")}
    links.update({"/bin/awk": "/usr/bin/mawk", "/bin/sh": "/usr/bin/dash"})
    return Image("busybox:1.36", digest(*(source.read_bytes() for source, _ in files.values()), *sorted(links)),
                 _from_files(files, links, ["sh"]))


def python_image() -> Image:
    return Image("python:3.11-slim", digest("debootstrap minbase bookworm", PYTHON_PACKAGES,
                                            HOST_CA_BUNDLE.read_bytes()), _python_base,
                 tags=["python:3.11-slim-bookworm"])


PROJECT_INPUTS = ("Dockerfile", "pyproject.toml", "README.md", "operator", "crds")


def operator_image(python: Image) -> Image:
    key = digest(python.key, tree_digest(REPO, PROJECT_INPUTS))

    def build(builder: Builder, image: Image) -> None:
        builder.buildah("bud", "--quiet", "--network=host", "--pull=never",
                        "--build-arg", "PYTHON_IMAGE=python:3.11-slim-bookworm",
                        "-t", builder.local(image), "-f", str(REPO / "Dockerfile"), str(REPO), timeout=3600)
    return Image(f"kubetune:dev-{key}", key, build, parents=[python])


def dockerfile_arg(name: str) -> str:
    """A global ``ARG name=value`` default of the Dockerfile (the Ray version lives there)."""
    match = re.search(rf"^ARG {name}=(\S+)", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    if not match:
        raise ImageError(f"the Dockerfile has no `ARG {name}=...`")
    return match.group(1)


def ray_base_image(python: Image) -> Image:
    """The stand-in for ``rayproject/ray:<v>-py311``: what the raycluster target needs of it
    (pip, ``ray`` on PATH, bash and wget for KubeRay's command and probes)."""
    version = dockerfile_arg("RAY_VERSION")
    install = ("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
               "--no-install-recommends wget >/dev/null && rm -rf /var/lib/apt/lists/* "
               f"&& pip install --no-cache-dir --disable-pip-version-check 'ray[default]=={version}'")

    def build(builder: Builder, image: Image) -> None:
        container = builder.buildah("from", "--pull=never", builder.local(python))
        try:
            builder.buildah("run", "--network=host", container, "--", "sh", "-c", install, timeout=3600)
            builder.buildah("commit", "--quiet", container, builder.local(image))
        finally:
            builder.remove(container)
    return Image(f"kubetune-ray-base:{version}-py311", digest(python.key, install), build, parents=[python])


def ray_image(python: Image) -> Image:
    """The Dockerfile's ``raycluster`` target (Ray + kubetune, for the RayCluster's pods)."""
    base = ray_base_image(python)
    key = digest(base.key, tree_digest(REPO, PROJECT_INPUTS))

    def build(builder: Builder, image: Image) -> None:
        builder.buildah("bud", "--quiet", "--network=host", "--pull=never", "--target", "raycluster",
                        "--build-arg", "PYTHON_IMAGE=python:3.11-slim-bookworm",
                        "--build-arg", f"RAY_IMAGE={builder.local(base)}",
                        "-t", builder.local(image), "-f", str(REPO / "Dockerfile"), str(REPO), timeout=3600)
    return Image(f"kubetune-ray:dev-{key}", key, build, parents=[python, base])
