"""Find, or build once per machine, the binaries of a wrapper Go module.

A wrapper module (``gomod/``, ``helmmod/``, ``kwokmod/``) pins one tool's version in its
go.mod and lists the packages to build in its ``tool`` block.  Its binaries live in
``${KUBETUNE_CACHE:-~/.cache/kubetune}/bin/<cache_name>-<version>/``, where version is
what go.mod requires of ``version_of``.  A binary is looked up first where
``overrides`` says (environment variables naming prebuilt binaries), then in that
cache directory; the missing ones are built into it.

The build holds a lock per cache directory (a test run and ``devcluster up`` may
race), writes into a temporary directory next to the cache and moves finished
binaries in, so a killed build never leaves half a binary behind.  GOCACHE and
GOMODCACHE keep their defaults so a second build is quick.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

Log = Callable[[str], None]


class BuildError(RuntimeError):
    pass


def cache_root() -> Path:
    return Path(os.environ.get("KUBETUNE_CACHE") or Path.home() / ".cache" / "kubetune").expanduser()


def env_paths(*variables: str) -> list[Path]:
    """The paths the set ones of ``variables`` name, in order."""
    return [Path(value).expanduser() for value in map(os.environ.get, variables) if value]


def _no_overrides(name: str) -> list[Path]:
    return []


def _no_link_vars(module: GoModule) -> Mapping[str, str]:
    return {}


@dataclass(frozen=True)
class GoModule:
    """One wrapper module: where its binaries are cached, how to find and build them."""
    directory: Path
    cache_name: str
    version_of: str                   # the required module whose version names the cache directory
    packages: Mapping[str, str]       # binary name -> Go package (the module's `tool` entries)
    prebuilt_hint: str                # the way around a build, for the error when `go` is missing
    overrides: Callable[[str], list[Path]] = _no_overrides     # name -> paths tried before the cache
    link_vars: Callable[[GoModule], Mapping[str, str]] = _no_link_vars  # `-ldflags -X` settings
    build_note: str = "a cold build takes a few minutes on 2 cores"

    def required_version(self, module: str) -> str:
        go_mod = self.directory / "go.mod"
        match = re.search(rf"^[ \t]*(?:require[ \t]+)?{re.escape(module)}[ \t]+(v\S+)",
                          go_mod.read_text(), re.MULTILINE)
        if not match:
            raise BuildError(f"{module} is not required by {go_mod}")
        return match.group(1)

    def version(self) -> str:
        return self.required_version(self.version_of)

    def source(self) -> Path:
        """The source tree of ``version_of`` at the pinned version, in the Go module cache
        (downloaded if missing): where a tool's CRDs and manifests come from."""
        go = shutil.which("go")
        if go is None:
            raise BuildError(f"{self.version_of}'s source (its CRDs) comes from the Go module cache: install Go")
        env = dict(os.environ, GOTOOLCHAIN="local")
        env.pop("GOFLAGS", None)
        target = f"{self.version_of}@{self.version()}"
        out = subprocess.run([go, "mod", "download", "-json", target], cwd=self.directory, env=env,
                             capture_output=True, text=True, timeout=600)
        try:
            directory = json.loads(out.stdout).get("Dir")
        except ValueError:
            directory = None
        if out.returncode != 0 or not directory:
            raise BuildError(f"cannot download {target}: {out.stderr or out.stdout}")
        return Path(directory)

    def cache_dir(self) -> Path:
        return cache_root() / "bin" / f"{self.cache_name}-{self.version()}"

    def candidates(self, name: str) -> list[Path]:
        return [*self.overrides(name), self.cache_dir() / name]

    def find(self, name: str) -> Path | None:
        return next((path for path in self.candidates(name)
                     if path.is_file() and os.access(path, os.X_OK)), None)

    def ensure(self, names: Iterable[str], log: Log = print) -> dict[str, Path]:
        """``{name: path}`` for each binary, building the missing ones into the cache."""
        names = list(names)
        unknown = set(names) - set(self.packages)
        if unknown:
            raise ValueError(f"unknown {self.cache_name} binaries: {sorted(unknown)}")
        found = {name: self.find(name) for name in names}
        missing = [name for name, path in found.items() if path is None]
        if missing:
            target = self.cache_dir()
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target.parent / f".{target.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                still_missing = [name for name in missing if self.find(name) is None]
                if still_missing:
                    self.build(still_missing, target, log)
            for name in missing:
                found[name] = self.find(name)
                if found[name] is None:
                    raise BuildError(f"{name} is still missing after the build "
                                     f"(looked in {self.candidates(name)})")
        return found  # type: ignore[return-value]

    def build(self, names: list[str], target: Path, log: Log = print) -> None:
        """Build ``names`` into ``target`` (created if needed)."""
        go = shutil.which("go")
        if go is None:
            raise BuildError(f"missing {', '.join(names)} and no `go` on PATH to build "
                             f"{'them' if len(names) > 1 else 'it'}: install Go >= {self._go_directive()}, "
                             f"or {self.prebuilt_hint}")
        version = self.version()
        ldflags = " ".join(["-s -w", *(f"-X {var}={value}" for var, value in self.link_vars(self).items())])
        env = dict(os.environ, GOTOOLCHAIN="local", CGO_ENABLED="0")
        env.pop("GOFLAGS", None)  # -mod=mod would rewrite the committed go.mod/go.sum
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
            out_dir = Path(tmp) / "out"
            out_dir.mkdir()
            build_log = Path(tmp) / "go-build.log"
            log(f"devcluster: building {', '.join(names)} ({self.cache_name} {version}) into {target}")
            log(f"devcluster: {self.build_note}; later runs reuse the binaries")
            started = time.monotonic()
            with open(build_log, "wb") as log_file:
                proc = subprocess.Popen(
                    [go, "build", "-trimpath", "-ldflags", ldflags, "-o", f"{out_dir}/",
                     *(self.packages[name] for name in names)],
                    cwd=self.directory, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL)
                try:
                    next_note = started + 30
                    while proc.poll() is None:
                        time.sleep(0.5)
                        if time.monotonic() >= next_note:
                            log(f"devcluster: still building {self.cache_name} ... "
                                f"{time.monotonic() - started:.0f}s")
                            next_note += 30
                except BaseException:
                    proc.terminate()
                    proc.wait()
                    raise
            if proc.returncode != 0:
                tail = "\n".join(build_log.read_text(errors="replace").splitlines()[-30:])
                raise BuildError(f"go build of {', '.join(names)} failed (exit {proc.returncode}):\n{tail}")
            for name in names:
                built = next((out_dir / candidate for candidate in _output_names(name, self.packages[name])
                              if (out_dir / candidate).is_file()), None)
                if built is None:
                    raise BuildError(f"go build produced no binary for {name} in {sorted(os.listdir(out_dir))}")
                os.replace(built, target / name)  # same filesystem: atomic
            log(f"devcluster: built {', '.join(names)} in {time.monotonic() - started:.0f}s")

    def _go_directive(self) -> str:
        match = re.search(r"^go[ \t]+(\d+\.\d+)", (self.directory / "go.mod").read_text(), re.MULTILINE)
        return match.group(1) if match else "the release its go.mod names"


def _output_names(name: str, package: str) -> tuple[str, ...]:
    # `go build -o dir/` names a main package by its last path element, or for
    # .../server/v3 by the one before the major version, depending on the Go release.
    elements = package.split("/")
    return name, elements[-1], elements[-2]
