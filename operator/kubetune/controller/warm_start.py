"""Which trials of earlier Experiments seed the search (``spec.warmStart``), fixed at the
first start so that a restarted operator seeds the same search again.

Reading the source Experiments' Trials afresh at every restart would not: a source
still running has more succeeded trials by then, and one deleted or re-created since
has none, so the study, the skipped duplicate configurations and the WarmStarted
condition would all change under a running search.  So the first start records, per
source, in the Experiment's status (``warmStartSources``, bounded): the source's UID,
the highest trial index it had, and which of those trials had not finished then.  A
restart uses the succeeded trials of that same Experiment up to that index, less the
ones unfinished at the first start; finished trials never change phase, so this is the
same set.  A source gone since cannot seed the search any more, and the condition says
so.  Pure."""
from __future__ import annotations

from typing import Any, Mapping

FINISHED = frozenset({"Succeeded", "Failed", "Stopped"})
# trials of a source not finished at the first start that are recorded; a source with
# more (a huge population still running) may seed a restart with a few more trials
MAX_UNFINISHED = 32


def _owner_uid(body: Mapping[str, Any]) -> str:
    refs = (body.get("metadata") or {}).get("ownerReferences") or ()
    return next((ref.get("uid") or "" for ref in refs if ref.get("kind") == "Experiment"), "")


def _index(body: Mapping[str, Any]) -> int:
    return int((body.get("spec") or {}).get("index", 0))


def snapshot(experiment: str, trials: list[Mapping[str, Any]]) -> tuple[dict[str, Any], list[Mapping[str, Any]]]:
    """At the first start: what to record of one source, and its Trials to use."""
    if not trials:
        return {"experiment": experiment, "uid": "", "through": -1}, []
    # during a re-created source's garbage-collection lag, its newest incarnation
    newest = max(trials, key=lambda t: ((t.get("metadata") or {}).get("creationTimestamp") or "", _index(t)))
    uid = _owner_uid(newest)
    own = [t for t in trials if _owner_uid(t) == uid]
    unfinished = sorted(_index(t) for t in own if (t.get("status") or {}).get("phase") not in FINISHED)
    record = {"experiment": experiment, "uid": uid, "through": max(_index(t) for t in own)}
    if unfinished:
        record["unfinished"] = unfinished[:MAX_UNFINISHED]
    return record, own


def select(record: Mapping[str, Any], trials: list[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], str]:
    """After a restart: the source's Trials the first start used, and "" or why they are gone."""
    if not record.get("uid"):
        return [], ""        # it had no Trials at the first start
    skipped = set(record.get("unfinished") or ())
    chosen = [t for t in trials if _owner_uid(t) == record["uid"] and _index(t) <= int(record.get("through", -1))
              and _index(t) not in skipped]
    if not chosen and not any(_owner_uid(t) == record["uid"] for t in trials):
        return [], (f"{record['experiment']}: deleted or re-created since this Experiment started; "
                    "its trials no longer seed the search")
    return chosen, ""
