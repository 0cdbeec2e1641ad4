"""A study's page data kept on disk, so that a dashboard that has just started (or
restarted: the chart's Pod) answers the first opening of a big Experiment at once.

Making the study-detail body of 10,000 trials x 100 results from the store takes ~10 s
on an idle machine and 40 s or more on a busy one (a million results read, 10,000
trials converted: see BENCHMARKS.md "Dashboard"), and an opening before it is done
waits for it.  What the body is made of can be checked far faster: the trial rows and
each trial's result count and seqs (``ResultsStoreStorage.state_key``, ~0.4 s).  So
the keeper writes each study's body here with that digest once the study stayed the
same for one of its rounds (30 s: not every round of a running Experiment), and a new
dashboard serves the written body when the store's digest is still the same (a
finished Experiment: always), while it makes its own in the background as before.  A
study whose digest differs (it changed while no dashboard ran) is made from the store.

One file per study: a JSON header line (the digest, the format, the versions that
shape the body, each piece's length), then the pieces' bytes.  Written to a temporary
file and renamed, so a reader never sees half a file (a temporary file a killed
dashboard left is removed by the next one); the directory is kept under ``max_bytes`` by
removing the oldest files.  Only this dashboard writes here, and a file that does not
parse as expected is ignored."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from importlib import metadata
from pathlib import Path

log = logging.getLogger(__name__)

FORMAT = 1
SUFFIX = ".study"
TEMPORARY = ".tmp"
LEFT_SECONDS = 600.0      # a temporary file older than this was left by a dashboard killed while writing


def _versions() -> dict[str, str]:
    """What else shapes the body: the serializers' versions and the local time zone
    (optuna-dashboard writes local times)."""
    found = {"format": str(FORMAT), "tz": f"{time.timezone}/{time.altzone}/{'/'.join(time.tzname)}"}
    for package in ("kubetune", "optuna", "optuna-dashboard"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "unknown"
    return found


class Snapshots:
    """``scope``: what the bodies are of (the store's URL): two stores never share a file."""

    def __init__(self, directory: str | Path, scope: str, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._scope = hashlib.sha256(scope.encode()).hexdigest()[:12]
        self._versions = _versions()
        self._remove_left_over()

    def _remove_left_over(self) -> None:
        """Temporary files a dashboard killed while writing left (not another's being written)."""
        for path in self.directory.glob(f"*{TEMPORARY}"):
            try:
                if time.time() - path.stat().st_mtime > LEFT_SECONDS:
                    path.unlink()
            except FileNotFoundError:
                continue
            except OSError as error:   # a directory we cannot write: saving will say so
                log.warning("kubetune dashboard: cannot remove %s: %s", path, error)

    def _path(self, study_id: int) -> Path:
        return self.directory / f"{self._scope}-{study_id}{SUFFIX}"

    def has(self, study_id: int) -> bool:
        """A file is kept for the study (of some state): worth computing its state's key."""
        return self._path(study_id).is_file()

    def load(self, study_id: int, key: str) -> tuple[list[bytes], list[bytes], bytes] | None:
        """(every trial's JSON, the best trials' JSON, the rest) written for the state
        ``key``, or None (no file, another state or version, or a file not as written)."""
        try:
            with open(self._path(study_id), "rb") as file:
                header = json.loads(file.readline())
                if header.get("key") != key or header.get("versions") != self._versions:
                    return None
                data = file.read()
        except FileNotFoundError:
            return None
        except (OSError, ValueError, AttributeError) as error:
            log.warning("kubetune dashboard: ignoring the kept page of study %s: %s", study_id, error)
            return None
        ordered, best, rest = header.get("ordered"), header.get("best"), header.get("rest")
        if not (isinstance(ordered, list) and isinstance(best, list) and isinstance(rest, int)
                and all(isinstance(n, int) and n >= 0 for n in ordered + best) and rest >= 0
                and sum(ordered) + sum(best) + rest == len(data)):
            log.warning("kubetune dashboard: ignoring the kept page of study %s: not as written", study_id)
            return None
        pieces, at = [], 0
        for length in ordered + best:
            pieces.append(data[at:at + length])
            at += length
        return pieces[:len(ordered)], pieces[len(ordered):], data[at:]

    def save(self, study_id: int, key: str, ordered: list[bytes], best: list[bytes], rest: bytes) -> bool:
        """Write the body of the state ``key``; False when it alone is over ``max_bytes``."""
        size = sum(map(len, ordered)) + sum(map(len, best)) + len(rest)
        if size > self.max_bytes:
            return False
        header = json.dumps({"key": key, "versions": self._versions, "ordered": [len(p) for p in ordered],
                             "best": [len(p) for p in best], "rest": len(rest)}).encode() + b"\n"
        self.directory.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=self.directory, suffix=TEMPORARY)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(header)
                file.writelines(ordered)
                file.writelines(best)
                file.write(rest)
            os.replace(temporary, self._path(study_id))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._trim(keep=self._path(study_id))
        return True

    def forget(self, study_id: int) -> None:
        """A deleted study's file goes too."""
        self._path(study_id).unlink(missing_ok=True)

    def _trim(self, keep: Path) -> None:
        """The oldest files go until the directory holds at most ``max_bytes``."""
        files = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total <= self.max_bytes:
                break
            if path != keep:
                path.unlink(missing_ok=True)
                total -= size
