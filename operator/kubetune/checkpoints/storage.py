"""Checkpoint storage: persist a trial's checkpoint directory, keep the latest N, restore.

Layout: ``<storage>/<namespace>/<experiment>/<trial>/checkpoint-<iteration:06d>``.
``storage`` is a local or shared filesystem path (a PVC mount) or a URI with a
scheme (``s3://``, ``gs://``, ``memory://``, ...), which goes through fsspec.

A checkpoint is written to a ``.tmp-*`` sibling first and renamed into place, with
a small metadata file (iteration, metrics) inside, so a crash mid-copy never
leaves a half checkpoint that a retry would restore from.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from kubetune.checkpoints import confined

log = logging.getLogger(__name__)

META_FILE = ".kubetune_checkpoint.json"
_NAME = re.compile(r"^checkpoint-(\d{6,})$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, found or read."""


def has_scheme(location: str) -> bool:
    return bool(_SCHEME.match(location)) and not location.startswith("file://")


def _strip_file_scheme(location: str) -> str:
    return location[len("file://"):] if location.startswith("file://") else location


def _fsspec(location: str):
    try:
        from fsspec.core import url_to_fs
    except ImportError as exc:  # pragma: no cover - fsspec ships with ray[default]
        raise CheckpointError(
            f"checkpoint storage {location!r} has a URI scheme, which needs fsspec "
            "and its filesystem package (e.g. `pip install fsspec s3fs`) in the trial's "
            "environment; or use a filesystem path such as a PVC mount"
        ) from exc
    try:
        return url_to_fs(location)
    except (ImportError, ValueError) as exc:
        raise CheckpointError(f"checkpoint storage {location!r}: {exc}") from exc


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/"), *parts])


@dataclass(frozen=True)
class StoredCheckpoint:
    iteration: int
    location: str
    metrics: Mapping[str, Any]


class CheckpointStore:
    """The checkpoints of one trial: ``<storage>/<trial_key>/checkpoint-*``.

    Retention after each persist: the ``keep_last`` newest, plus the ``keep_best``
    best by ``metric`` (``mode`` min or max); everything else is deleted.
    """

    def __init__(self, storage: str, trial_key: str, *, keep_last: int = 2,
                 keep_best: int = 0, metric: str | None = None, mode: str = "min"):
        if not storage:
            raise CheckpointError("no checkpoint storage configured (spec.checkpoint.storage)")
        if keep_last < 1:
            raise CheckpointError(f"keep_last must be >= 1, got {keep_last}")
        self.trial_dir = _join(_strip_file_scheme(storage), trial_key)
        self.keep_last = keep_last
        self.keep_best = keep_best if metric else 0
        self.metric = metric
        self.mode = mode
        self._remote = has_scheme(storage)
        if self._remote:
            self._fs, self._root = _fsspec(self.trial_dir)

    # ---------------------------------------------------------------- public

    def persist(self, local_dir: str | os.PathLike, iteration: int,
                metrics: Mapping[str, Any], also_keep: Iterable[str] = ()) -> str:
        """Copy ``local_dir`` in as the checkpoint of ``iteration``; return its location.
        ``also_keep``: checkpoints retention must not delete (those the operator knows of,
        which it may resume from or hand to another trial)."""
        source = os.fspath(local_dir)
        if not os.path.isdir(source):
            raise CheckpointError(f"report(checkpoint={source!r}): not a directory")
        name = f"checkpoint-{iteration:06d}"
        meta = json.dumps({"iteration": iteration, "metrics": dict(metrics),
                           "time": time.time()}, default=str)
        if self._remote:
            location = self._persist_remote(source, name, meta)
        else:
            location = self._persist_local(source, name, meta)
        self._apply_retention(protect=location, also_keep=also_keep)
        return location

    def trim(self) -> None:
        """Apply retention without a new checkpoint (when the trial ends)."""
        stored = self.list()
        if stored:
            self._apply_retention(protect=stored[-1].location)

    def list(self) -> list[StoredCheckpoint]:
        """Complete checkpoints of this trial, oldest first."""
        found = []
        for entry in self._list_names():
            match = _NAME.match(entry)
            if not match:
                continue
            location = _join(self.trial_dir, entry)
            found.append(StoredCheckpoint(int(match.group(1)), location,
                                          self._read_meta(location)))
        return sorted(found, key=lambda c: c.iteration)

    # ---------------------------------------------------------------- local

    def _persist_local(self, source: str, name: str, meta: str) -> str:
        os.makedirs(self.trial_dir, exist_ok=True)
        final = os.path.join(self.trial_dir, name)
        tmp = os.path.join(self.trial_dir, f".tmp-{name}-{uuid.uuid4().hex[:8]}")
        _copy_into_place(source, tmp, final, meta=meta, failure=f"cannot persist checkpoint to {final}")
        return os.path.abspath(final)

    # ---------------------------------------------------------------- fsspec

    def _persist_remote(self, source: str, name: str, meta: str) -> str:
        fs, root = self._fs, self._root
        final = _join(root, name)
        tmp = _join(root, f".tmp-{name}-{uuid.uuid4().hex[:8]}")
        try:
            fs.makedirs(root, exist_ok=True)
            fs.put(source.rstrip("/") + "/", tmp + "/", recursive=True)
            with fs.open(_join(tmp, META_FILE), "w") as f:
                f.write(meta)
            if fs.exists(final):
                fs.rm(final, recursive=True)
            fs.mv(tmp, final, recursive=True)
        except Exception as exc:  # fsspec backends raise many types
            raise CheckpointError(f"cannot persist checkpoint to {_join(self.trial_dir, name)}: {exc}") from exc
        return _join(self.trial_dir, name)

    # ---------------------------------------------------------------- retention

    def _list_names(self) -> list[str]:
        if self._remote:
            try:
                return [p.rstrip("/").rsplit("/", 1)[-1]
                        for p in self._fs.ls(self._root, detail=False)]
            except FileNotFoundError:
                return []
        try:
            return os.listdir(self.trial_dir)
        except FileNotFoundError:
            return []

    def _read_meta(self, location: str) -> Mapping[str, Any]:
        try:
            if self._remote:
                with self._fs.open(_join(self._root, location.rsplit("/", 1)[-1], META_FILE)) as f:
                    return json.load(f).get("metrics", {})
            with open(os.path.join(location, META_FILE)) as f:
                return json.load(f).get("metrics", {})
        except (OSError, ValueError):
            return {}

    def _delete(self, entry: str) -> None:
        if self._remote:
            try:
                self._fs.rm(_join(self._root, entry), recursive=True)
            except FileNotFoundError:
                pass
        else:
            shutil.rmtree(os.path.join(self.trial_dir, entry), ignore_errors=True)

    def _apply_retention(self, protect: str, also_keep: Iterable[str] = ()) -> None:
        stored = self.list()
        keep = {c.location for c in stored[-self.keep_last:]}
        if self.keep_best:
            scored = [c for c in stored if isinstance(c.metrics.get(self.metric), (int, float))]
            scored.sort(key=lambda c: c.metrics[self.metric], reverse=self.mode == "max")
            keep |= {c.location for c in scored[: self.keep_best]}
        keep.add(protect)
        keep |= set(also_keep)
        for checkpoint in stored:
            if checkpoint.location not in keep:
                self._delete(checkpoint.location.rsplit("/", 1)[-1])
        # Leftovers of writes interrupted by a crash: one attempt writes at a time.
        for entry in self._list_names():
            if entry.startswith(".tmp-"):
                self._delete(entry)


def materialize(location: str, dest_parent: str | None = None) -> str:
    """A local copy of the checkpoint at ``location`` (path or URI); returns its directory.

    Always a copy, so the function may modify it freely and retention may delete
    the stored one while the function runs.
    """
    parent = tempfile.mkdtemp(prefix="kubetune-restore-", dir=dest_parent)
    target = os.path.join(parent, location.rstrip("/").rsplit("/", 1)[-1] or "checkpoint")
    if has_scheme(location):
        fs, path = _fsspec(location)
        if not fs.isdir(path):
            raise CheckpointError(f"checkpoint {location!r} does not exist")
        fs.get(path.rstrip("/") + "/", target + "/", recursive=True)
    else:
        path = _strip_file_scheme(location)
        if not os.path.isdir(path):
            raise CheckpointError(f"checkpoint {location!r} does not exist")
        shutil.copytree(path, target, symlinks=True)
    meta = os.path.join(target, META_FILE)
    if os.path.exists(meta):
        os.remove(meta)
    return target


class CheckpointOutsideStorage(CheckpointError):
    """A reported checkpoint location outside the Experiment's own storage prefix."""


def confine(location: str, storage: str, prefix: str) -> str:
    """``location`` if it lies under ``<storage>/<prefix>/`` (``prefix``: the Experiment's
    ``<namespace>/<experiment>``), as the path to read it at; else CheckpointOutsideStorage.

    The operator copies and deletes with its own filesystem and cloud credentials, and a
    trial reports the location: without this, a pod could name the operator's
    ServiceAccount token directory or another team's bucket and read the copy.  Refused:
    another scheme or bucket, ``.``/``..`` segments, a query or fragment, and on a
    filesystem anything whose real path (symlinks resolved) leaves the prefix.
    """
    def refuse(why: str) -> CheckpointOutsideStorage:
        return CheckpointOutsideStorage(f"checkpoint {location[:300]!r} is outside this Experiment's storage "
                                        f"{_join(storage, prefix)}/ ({why}); the operator copies nothing from there")
    if has_scheme(storage):
        from urllib.parse import urlsplit
        root, found = urlsplit(_join(storage, prefix) + "/"), urlsplit(location)
        if (found.scheme.lower(), found.netloc) != (root.scheme.lower(), root.netloc):
            raise refuse("another scheme or bucket")
        if found.query or found.fragment:
            raise refuse("a query or fragment")
        if any(part in (".", "..") for part in found.path.split("/")):
            raise refuse("a '.' or '..' segment")
        if not found.path.startswith(root.path) or found.path.rstrip("/") == root.path.rstrip("/"):
            raise refuse("another prefix")
        return location
    if has_scheme(location):
        raise refuse("a URI, where the storage is a filesystem path")
    path = _strip_file_scheme(location)
    if any(part in (".", "..") for part in path.split("/")[1:]):
        raise refuse("a '.' or '..' segment")
    root = os.path.realpath(_join(_strip_file_scheme(storage), prefix))
    real = os.path.realpath(path)
    if os.path.commonpath([root, real]) != root or real == root:
        raise refuse("its real path leaves the prefix")
    return real   # copied through descriptors (clone_checkpoint): a symlink swapped in later is not followed


CLONE_PREFIX = "exploit-"
_CLONE_TMP_PREFIX = ".exploit-tmp-"     # not ".tmp-": the trial's own retention deletes those


def clone_checkpoint(location: str, storage: str, trial_key: str, iteration: int) -> str:
    """Copy another trial's checkpoint (a PBT exploit) into ``trial_key``'s own directory,
    as ``exploit-<iteration>``; returns its location.

    Retention (of either trial) only deletes ``checkpoint-*`` entries, so the copy stays
    until the trial's storage goes; the trial's earlier copies are removed (it continues
    from this one, and no other trial points into its storage).
    """
    location = confine(location, storage, "/".join(trial_key.split("/")[:2]))
    trial_dir = _join(_strip_file_scheme(storage), trial_key)
    name = f"{CLONE_PREFIX}{iteration:06d}"
    final = _join(trial_dir, name)
    tmp_name = f"{_CLONE_TMP_PREFIX}{uuid.uuid4().hex[:8]}"
    if has_scheme(storage):
        fs, root = _fsspec(trial_dir)
        source_fs, source = _fsspec(location)
        try:
            if not source_fs.isdir(source):
                raise CheckpointError(f"checkpoint {location!r} does not exist")
            fs.makedirs(root, exist_ok=True)
            fs.copy(source.rstrip("/") + "/", _join(root, tmp_name) + "/", recursive=True)
            if fs.exists(_join(root, name)):
                fs.rm(_join(root, name), recursive=True)
            fs.mv(_join(root, tmp_name), _join(root, name), recursive=True)
            stale = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)]
            for entry in stale:
                if entry != name and entry.startswith((CLONE_PREFIX, _CLONE_TMP_PREFIX)):
                    fs.rm(_join(root, entry), recursive=True)
        except CheckpointError:
            raise
        except Exception as exc:  # fsspec backends raise many types
            raise CheckpointError(f"cannot copy checkpoint {location} to {final}: {exc}") from exc
        return final
    _clone_on_filesystem(location, storage, trial_key, name, tmp_name)
    return os.path.abspath(final)


def _clone_on_filesystem(location: str, storage: str, trial_key: str, name: str, tmp_name: str) -> None:
    """The copy of ``clone_checkpoint`` on a filesystem the trials' pods share: from the
    storage root down, through directory descriptors, following no link (confined.py),
    so nothing swapped in after ``confine`` checked the path is read or written."""
    root = os.path.realpath(_strip_file_scheme(storage))
    relative = os.path.relpath(_strip_file_scheme(location), root)
    prefix = "/".join(trial_key.split("/")[:2])
    if not relative.startswith(prefix + "/"):
        raise CheckpointOutsideStorage(f"checkpoint {location[:300]!r} is outside this Experiment's storage "
                                       f"{_join(storage, prefix)}/; the operator copies nothing from there")
    try:
        confined.clone(root, relative, trial_key, name, tmp_name, stale=(CLONE_PREFIX, _CLONE_TMP_PREFIX))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {location!r} does not exist") from None
    except confined.UnsafeEntry as error:
        raise CheckpointOutsideStorage(f"checkpoint {location[:300]!r} not copied: {error}; the operator "
                                       "follows no symbolic link in a trial's storage") from None
    except OSError as error:
        raise CheckpointError(f"cannot copy checkpoint {location} to {_join(storage, trial_key, name)}: "
                              f"{error}") from error


def delete_trial_checkpoints(storage: str, trial_key: str) -> None:
    """Remove every checkpoint of one trial (``checkpoint.deleteOnCompletion``)."""
    trial_dir = _join(_strip_file_scheme(storage), trial_key)
    if has_scheme(storage):
        fs, path = _fsspec(trial_dir)
        try:
            fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
    else:   # through descriptors: a directory above the trial's swapped for a link is not followed
        parent, _, trial = trial_key.rpartition("/")
        try:
            fd = confined.open_below(os.path.realpath(_strip_file_scheme(storage)), parent)
        except OSError:     # gone already, or a link: nothing of this trial to remove there
            return
        try:
            confined.remove(fd, trial)
        except OSError as error:
            log.warning("cannot delete the checkpoints of %s: %s", trial_key, error)
        finally:
            os.close(fd)


def clone_checkpoint_or_newer(source: str, storage: str, trial_key: str, iteration: int | None) -> str:
    """``clone_checkpoint``; if the donor's retention already deleted ``source`` (a pod
    trial keeps only its ``keepLast`` newest, whatever the operator has seen), the
    donor's newest checkpoint instead: a later state of the same run, rather than a
    launch from a path that no longer exists."""
    try:
        return clone_checkpoint(source, storage, trial_key, iteration or 0)
    except CheckpointOutsideStorage:
        raise
    except CheckpointError as error:
        parent, _, entry = source.rstrip("/").rpartition("/")
        root = _strip_file_scheme(storage).rstrip("/")
        if "does not exist" not in str(error) or not entry.startswith("checkpoint-") \
                or not parent.startswith(root + "/"):
            raise
        stored = CheckpointStore(storage, parent[len(root) + 1:]).list()
        if not stored:
            raise
        log.warning("%s is gone; %s continues from the donor's newest, %s", source, trial_key,
                    stored[-1].location)
        return clone_checkpoint(stored[-1].location, storage, trial_key, iteration or 0)


def _copy_into_place(source: str, tmp: str, final: str, *, failure: str, meta: str | None = None) -> None:
    """Copy directory ``source`` to ``final`` through ``tmp`` (with ``meta`` written into it),
    so a reader never sees a half-written ``final``; one that exists (a retry reaching the
    same iteration again) is replaced.  A failure leaves no ``tmp`` behind."""
    try:
        shutil.copytree(source, tmp, symlinks=True)
        if meta is not None:
            with open(os.path.join(tmp, META_FILE), "w") as f:
                f.write(meta)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"{failure}: {exc}") from exc
