"""One scale run: control plane, a Ray head with fractional-CPU trials, the operator
(cluster-wide) as a subprocess; apply every shape at once, SIGKILL the operator when
half of all trials finished and start it again at once, wait until every Experiment
finished, then measure and verify.  Returns every figure as one dict (report.py)."""
from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from kubetune.bench import machine, report as bench_report
from kubetune.bench.kube import KubeBench, Operator, RayHead
from kubetune.bench.scale import apimetrics, checks, fairness, idle, shapes
from kubetune.bench.scale.observe import FINAL_EXPERIMENT_PHASES, Observer
from kubetune.bench.scale.procstat import ProcessWatch

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class Settings:
    shapes: tuple[str, ...] = ("many", "big")
    experiments: int = 200
    namespaces: int = 20
    trials: int = 10
    reports: int = 3
    parallelism: int = 2
    big_trials: int = 10_000
    big_parallelism: int = 32
    cpu: float = 0.05
    ray_cpus: int = 2
    restart: bool = True
    timeout_s: float = 3600.0

    def planned(self) -> list[shapes.Planned]:
        planned = []
        if "many" in self.shapes:
            planned += shapes.many(experiments=self.experiments, namespaces=self.namespaces, trials=self.trials,
                                   reports=self.reports, parallelism=self.parallelism, cpu=self.cpu)
        if "big" in self.shapes:
            planned.append(shapes.big(trials=self.big_trials, parallelism=self.big_parallelism, cpu=self.cpu))
        return planned


class ScaleRun:
    def __init__(self, settings: Settings, log: Log = print) -> None:
        self.settings = settings
        self.log = log
        self.planned = settings.planned()
        self.total_trials = sum(p.trials for p in self.planned)
        self.timed_out = False

    def run(self) -> dict[str, Any]:
        figures: dict[str, Any] = {"settings": dataclasses.asdict(self.settings),
                                   "machine": machine.machine_info()}
        figures["machine"]["git_commit"], figures["machine"]["git_dirty"] = machine.git_state()
        with KubeBench(log=self.log) as bench:
            head = RayHead(self.settings.ray_cpus, bench.env).start()
            try:
                figures.update(self._run(bench, head))
            finally:
                head.stop()
        figures["machine"]["loadavg_end"] = machine.loadavg_text()
        return figures

    def _run(self, bench: KubeBench, head: RayHead) -> dict[str, Any]:
        runs_dir = tempfile.mkdtemp(prefix="runs-", dir=bench.workdir)
        operator = Operator(bench.plane.kubeconfig, None, head.address, bench.workdir, bench.env)
        watches = [ProcessWatch(operator.process.pid).start()]
        # apply once it runs and is connected to Ray (it connects at start-up, in the
        # background): apply -> first Trial is the operator's work for a new Experiment
        # applied to a running operator, not its own start (which restart -> progress measures)
        self.log(f"operator up in {operator.wait_healthy():.1f} s")
        self.log(f"operator connected to Ray in a further {operator.wait_ray_connected(head.address):.1f} s")
        idle_rss = _tree_rss_mib(operator.process.pid)     # what the operator holds with nothing to do
        observer = Observer(bench._api, log=self.log).start()
        before = apimetrics.parse(bench.metrics_text())
        out: dict[str, Any] = {}
        self.idle = idle.Sampler(operator.metrics_port, self.settings.cpu,
                                 int(self.settings.ray_cpus / self.settings.cpu + 1e-6))
        try:
            began = time.time()
            observer.apply(self.planned, runs_dir)
            self.log(f"applied {len(self.planned)} Experiments ({self.total_trials} trials) "
                     f"in {time.time() - began:.1f} s")
            restart = self._wait(observer, operator, watches, began)
            ended = time.time()
            self.idle.read(every_s=0.0)       # the ledger's last counters, before the operator stops
            out["idle"] = self.idle.figures()
            after = self._settled(bench)
            out["operator"] = self._operator_figures(watches, idle_rss)
        finally:
            observer.stop()
            operator.stop()
        own = {k: float(v) for k, v in observer.own_requests.items()}
        used = apimetrics.delta(before, after)
        out["api"] = {"requests_operator": apimetrics.minus_own(used.requests, own),
                      "requests_by_verb": apimetrics.by_verb(apimetrics.minus_own(used.requests, own)),
                      "requests_benchmark": own, "latency": apimetrics.latency(used),
                      "storage_bytes_metric": used.storage_bytes,
                      "etcd_db_bytes": _file_size(bench.plane.state_dir / "etcd" / "member" / "snap" / "db")}
        out["timeline"] = self._timeline(observer, began, ended, restart)
        out["timeline"]["timed_out"] = self.timed_out
        verdict = checks.verify(observer.custom, self.planned, runs_dir=runs_dir, results_url=operator.results_url)
        out["verdict"] = checks.summary(verdict)
        out["objects"] = {"experiment_bytes_max": verdict.experiment_bytes_max,
                          "trial_bytes_max": verdict.trial_bytes_max,
                          "trial_bytes_mean": round(verdict.trial_bytes_mean, 1)}
        applied = {k: observer.experiments[k].applied for k in (p.key for p in self.planned)
                   if observer.experiments[k].applied is not None}
        runs = fairness.runs_of(self.planned, verdict.trials_by_key, applied)
        out["fairness"] = fairness.summarize(runs, fairness.shares(runs))
        starved = fairness.starvation(runs)
        out["fairness"]["starvation_max_completions"] = max(starved.values(), default=0)
        out["fairness"]["starvation_worst"] = max(starved, key=starved.get) if starved else None
        out["fairness"]["runs"] = {r.key: {"applied": r.applied, "trials": r.trials} for r in runs}   # to look into
        if "big" in self.settings.shapes:
            out["kubectl_get_trials_big_s"] = self._kubectl_get(bench, shapes.big(
                trials=0, parallelism=1, cpu=0).namespace)
        if verdict.problems:
            self.log(f"{len(verdict.problems)} problems, the first: {verdict.problems[:5]}")
            self.log(operator.log_tail())
        return out

    # ------------------------------------------------------------ while it runs

    def _wait(self, observer: Observer, operator: Operator, watches: list[ProcessWatch],
              began: float) -> dict[str, Any] | None:
        keys = [p.key for p in self.planned]
        deadline = time.monotonic() + self.settings.timeout_s
        restart: dict[str, Any] | None = None
        last_note = 0.0
        while observer.finished(keys) < len(keys):
            if time.monotonic() > deadline:
                # measured as far as it got: the verdict names what did not finish
                self.log(f"not finished after {self.settings.timeout_s:.0f} s: "
                         f"{observer.finished(keys)}/{len(keys)} Experiments; measuring what ran")
                self.timed_out = True
                break
            if not operator.alive():
                raise RuntimeError(f"the operator exited with {operator.process.returncode}:\n{operator.log_tail()}")
            done = observer.trials_finished(keys)
            if self.settings.restart and restart is None and done >= self.total_trials / 2:
                self.idle.read(every_s=0.0)
                self.idle.restarted()
                restart = self._kill_and_restart(observer, operator, watches, done)
            if time.time() - last_note > 30:
                last_note = time.time()
                self.log(f"{time.time() - began:6.0f} s: {done}/{self.total_trials} trials finished, "
                         f"{observer.finished(keys)}/{len(keys)} Experiments")
            self.idle.read()
            time.sleep(0.5)
        return restart

    def _kill_and_restart(self, observer: Observer, operator: Operator, watches: list[ProcessWatch],
                          done: int) -> dict[str, Any]:
        watches[-1].stop()
        killed = time.time()
        operator.kill()
        # progress after the restart must be the new operator's: let the watch deliver
        # the dead one's last writes first
        quiet = observer.quiet(3.0)
        operator.start()
        watches.append(ProcessWatch(operator.process.pid).start())
        self.log(f"SIGKILLed the operator at {done}/{self.total_trials} trials finished; restarted")
        return {"killed": killed, "restarted": time.time(), "trials_finished_at_kill": done,
                "watch_quiet_before_restart": quiet}

    def _settled(self, bench: KubeBench, quiet_s: float = 3.0, timeout_s: float = 60.0) -> apimetrics.Snapshot:
        """The apiserver's metrics once the operator's last writes are done."""
        snap = apimetrics.parse(bench.metrics_text())
        since, deadline = time.monotonic(), time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(1.0)
            now = apimetrics.parse(bench.metrics_text())
            if now.requests != snap.requests:
                snap, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
        return snap

    # ------------------------------------------------------------ figures

    def _operator_figures(self, watches: list[ProcessWatch], idle_rss: float) -> dict[str, Any]:
        end_rss = _tree_rss_mib(watches[-1].pid)
        each = [w.stop() for w in watches]
        # Everything is finished at the end: what the operator holds beyond its start is what
        # finished Experiments and Trials cost it, plus its Ray connection and the modules it
        # loaded meanwhile (~90 MiB at 5 Experiments): upper bounds, each charged to one kind
        grown_kib = max(end_rss - idle_rss, 0.0) * 1024
        return {"peak_rss_mib": max(f["peak_rss_mib"] for f in each), "cpu_s": sum(f["cpu_s"] for f in each),
                "rss_at_end_mib": end_rss, "rss_idle_mib": idle_rss,
                "finished_kib_per_experiment": grown_kib / max(len(self.planned), 1),
                "finished_kib_per_trial": grown_kib / max(self.total_trials, 1), "processes": each}

    def _timeline(self, observer: Observer, began: float, ended: float,
                  restart: dict[str, Any] | None) -> dict[str, Any]:
        done = observer.trials_finished(p.key for p in self.planned)
        timeline: dict[str, Any] = {"wall_s": ended - began, "trials": self.total_trials, "trials_finished": done,
                                    "trials_per_s": done / (ended - began)}
        for shape in ("many", "big"):
            members = [p for p in self.planned if p.shape == shape]
            if not members:
                continue
            seen = [observer.experiments[p.key] for p in members]
            finished = [min((t for ph, t in s.phases.items() if ph in FINAL_EXPERIMENT_PHASES), default=ended)
                        for s in seen]
            first_applied = min(s.applied for s in seen)
            wall = max(finished) - first_applied
            trials = observer.trials_finished(p.key for p in members)
            to_first = [s.first_trial - s.applied for s in seen if s.first_trial is not None]
            to_started = [s.first_started - s.applied for s in seen if s.first_started is not None]
            timeline[shape] = {
                "experiments": len(members), "trials": trials, "wall_s": wall, "trials_per_s": trials / wall,
                "apply_to_first_trial_s": _spread(to_first),
                "apply_to_first_trial_started_s": _spread(to_started)}
        if restart:
            keys = [p.key for p in self.planned]
            progress = observer.first_progress_after(restart["restarted"], keys)
            waits = [t - restart["restarted"] for t in progress.values() if t is not None]
            restart.update(experiments_unfinished=len(progress),
                           never_progressed=sum(1 for t in progress.values() if t is None),
                           restart_to_all_progressing_s=max(waits) if waits and len(waits) == len(progress) else None,
                           restart_to_progress_p50_s=bench_report.percentile(waits, 0.5))
            timeline["restart"] = restart
        return timeline

    def _kubectl_get(self, bench: KubeBench, namespace: str) -> float | None:
        """``kubectl get trials`` of the big Experiment (kubectl pages by 500)."""
        started = time.monotonic()
        try:
            rows = bench.kubectl_get_trials(namespace, "--no-headers", timeout_s=300)
        except RuntimeError as error:
            self.log(str(error))
            return None
        took = time.monotonic() - started
        self.log(f"kubectl get trials -n {namespace}: {rows} rows in {took:.2f} s")
        return took

def _spread(values: list[float]) -> dict[str, float | None]:
    return {"p50": bench_report.percentile(values, 0.5), "p95": bench_report.percentile(values, 0.95),
            "max": max(values) if values else None, "n": len(values)}


def _file_size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _tree_rss_mib(pid: int) -> float:
    from kubetune.bench.scale.procstat import descendants, rss_bytes
    return rss_bytes(descendants(pid)) / 2 ** 20
