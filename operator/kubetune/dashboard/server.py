"""optuna-dashboard's WSGI app over the results store, served by a threaded wsgiref
server (the dashboard's own ``run_server`` serves one request at a time: a page
opening behind a poll of a big study would wait for it).

One route is kubetune's: ``/experiments/<namespace>/<name>`` redirects to the page of
the newest Experiment of that name, the address ``status.dashboard`` names."""
from __future__ import annotations

import socketserver
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server as _make_server

from kubetune.dashboard.storage import ResultsStoreStorage
from kubetune.results.study_meta import EXPERIMENT_PATH

EXPERIMENT_ROUTE = EXPERIMENT_PATH.format(namespace="<namespace>", name="<name>")


def make_app(storage: ResultsStoreStorage):
    import bottle
    import optuna_dashboard

    app = optuna_dashboard.wsgi(storage)

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


def make_server(storage: ResultsStoreStorage, host: str, port: int) -> WSGIServer:
    return _make_server(host, port, make_app(storage), server_class=_ThreadingServer, handler_class=_QuietHandler)
