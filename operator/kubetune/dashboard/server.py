"""optuna-dashboard's WSGI app over the results store, served by a threaded wsgiref
server (the dashboard's own ``run_server`` serves one request at a time: a page
opening behind a poll of a big study would wait for it).

Three routes are kubetune's: ``/experiments/<namespace>/<name>`` redirects to the page
of the newest Experiment of that name, the address ``status.dashboard`` names;
``/kubetune/ready``, the chart's readiness probe; and the study-detail API, answered
from JSON made once per trial (``detail``: the same body as optuna-dashboard's own view,
which it replaces, without converting every trial again on each request)."""
from __future__ import annotations

import json
import socketserver
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server as _make_server

from kubetune.dashboard import dashboard_compat
from kubetune.dashboard.detail import StudyDetails
from kubetune.dashboard.snapshot import Snapshots
from kubetune.dashboard.storage import ResultsStoreStorage
from kubetune.results.study_meta import EXPERIMENT_PATH

EXPERIMENT_ROUTE = EXPERIMENT_PATH.format(namespace="<namespace>", name="<name>")
READY_ROUTE = "/kubetune/ready"


def make_app(storage: ResultsStoreStorage, *, warm: bool = True, snapshots: Snapshots | None = None):
    """``warm``: make every study's page data in the background now, and keep it fresh
    (``detail.StudyDetails.start``; ``app.kubetune_details.stop()`` ends that);
    ``snapshots``: keep it on disk too, for the next start (``snapshot``)."""
    import bottle
    import optuna_dashboard

    app = optuna_dashboard.wsgi(storage)
    details = app.kubetune_details = StudyDetails(storage, dashboard_compat.app_cache(app), snapshots)
    if warm:
        details.start()
    else:
        details.ready.set()

    @app.get(READY_ROUTE)
    def ready():
        """The chart's readiness probe: a Pod serves once every study has its page data
        (kept on disk, or read from the store), so a rolling update keeps the old Pod in
        the Service until the new one answers at once."""
        if details.ready.is_set():
            return "ready\n"
        bottle.response.status = 503
        return "reading the results store (the warm-up)\n"

    # the same rule as optuna-dashboard's own view: Bottle lets the later route replace it
    @app.get("/api/studies/<study_id:int>")
    def study_detail(study_id: int):
        bottle.response.content_type = "application/json"
        try:
            after = int(bottle.request.params.get("after", 0))
        except ValueError:
            after = -1
        if after < 0:   # optuna-dashboard's answers, word for word
            bottle.response.status = 400
            return json.dumps({"reason": "`after` should be larger or equal 0."})
        body = details.body(study_id, after)
        if body is None:
            bottle.response.status = 404
            return json.dumps({"reason": f"study_id={study_id} is not found"})
        return body

    @app.get(EXPERIMENT_ROUTE)
    def experiment(namespace: str, name: str):
        study_id = storage.study_id_for(namespace, name)
        if study_id is None:
            bottle.response.status = 404
            return f"no Experiment {namespace}/{name} in the results store (yet: its first result creates it)\n"
        bottle.redirect(f"/dashboard/studies/{study_id}")

    return app


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, *args, **kwargs) -> None:   # a poll every few seconds: not worth a line
        pass


def make_server(storage: ResultsStoreStorage, host: str, port: int, *, warm: bool = True,
                snapshots: Snapshots | None = None) -> WSGIServer:
    return _make_server(host, port, make_app(storage, warm=warm, snapshots=snapshots),
                        server_class=_ThreadingServer, handler_class=_QuietHandler)
