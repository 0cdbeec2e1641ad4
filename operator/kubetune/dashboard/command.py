"""``kubetune dashboard [EXPERIMENT] [-n NS] [--port P] [--store URL]``: optuna-dashboard
over the results store, read-only, in a browser.

Where the store is: ``--store URL``, else ``$KUBETUNE_RESULTS_URL``, else the local
SQLite file ``kubetune run`` writes.  With EXPERIMENT, only that Experiment is shown
and its page's address is printed; without, every Experiment (of ``-n`` if given)."""
from __future__ import annotations

import argparse
import os
import threading
from pathlib import Path
from typing import Callable

from sqlalchemy.engine import make_url

from kubetune.results.store import URL_ENV, default_url, open_store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("experiment", nargs="?", default=None, help="only this Experiment (default: all)")
    parser.add_argument("--namespace", "-n", default=None,
                        help="only this namespace (`kubetune run` uses 'local'); with EXPERIMENT, needed when "
                             "Experiments of that name exist in several namespaces")
    parser.add_argument("--port", "-p", type=int, default=8080, help="port to listen on (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: this machine only; 0.0.0.0 in a Pod)")
    parser.add_argument("--store", default="",
                        help=f"results store URL (default: ${URL_ENV}, else {default_url()})")
    parser.add_argument("--cache-dir", default=default_cache_dir(),
                        help="keep each study's page data here, so a restarted dashboard opens a big Experiment "
                             "at once (default: %(default)s; '' keeps nothing)")
    parser.add_argument("--cache-size", type=int, default=1024, metavar="MiB",
                        help="at most this much in --cache-dir; the oldest studies' data goes first "
                             "(default: %(default)s)")
    parser.add_argument("--wait-for-store", action="store_true",
                        help="serve even before the store exists (no study until it does): the chart's Pod "
                             "starts before the operator's first result creates its SQLite file")


def main(args: argparse.Namespace) -> int:
    from kubetune.dashboard.server import make_server
    from kubetune.dashboard.storage import ResultsStoreStorage

    namespace = args.namespace
    if args.wait_for_store:   # the chart's Pod: serve (no study yet) until the operator creates the store
        storage = ResultsStoreStorage(lambda: open_store(args.store or None, read_only=True), namespace=namespace)
        shown = make_url(args.store or default_url()).render_as_string(hide_password=True)
        return serve(make_server(storage, args.host, args.port, snapshots=snapshots(args, shown)), args.host,
                     "/dashboard", shown, lambda: None)
    try:
        store = open_store(args.store or None, read_only=True)
    except FileNotFoundError as error:
        raise SystemExit(str(error)) from None
    if args.experiment:
        namespaces = sorted({e.namespace for e in store.experiments(namespace) if e.name == args.experiment})
        if not namespaces:
            known = sorted({f"{e.namespace}/{e.name}" for e in store.experiments()})
            raise SystemExit(f"no results for experiment {args.experiment!r}"
                             f"{f' in namespace {namespace!r}' if namespace else ''} in {store.url_shown}; "
                             f"experiments there: {', '.join(known[:20]) or 'none'}")
        if len(namespaces) > 1:
            raise SystemExit(f"experiment {args.experiment!r} exists in namespaces {', '.join(namespaces)}: "
                             "choose one with --namespace")
        namespace = namespaces[0]
    storage = ResultsStoreStorage(store, namespace=namespace, experiment=args.experiment)
    page = "/dashboard"
    if args.experiment:
        page = f"/dashboard/studies/{storage.study_id_for(namespace, args.experiment)}"
    return serve(make_server(storage, args.host, args.port, snapshots=snapshots(args, store.url_shown)), args.host,
                 page, store.url_shown, store.close)


def default_cache_dir() -> str:
    return str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kubetune" / "dashboard")


def snapshots(args: argparse.Namespace, store_shown: str):
    """Where each study's page data is kept between runs (``dashboard.snapshot``), if anywhere."""
    from kubetune.dashboard.snapshot import Snapshots
    return Snapshots(args.cache_dir, store_shown, args.cache_size << 20) if args.cache_dir else None


def serve(server, host: str, page: str, store_shown: str, close: Callable[[], None]) -> int:
    shown_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    print(f"kubetune dashboard: http://{shown_host}:{server.server_port}{page} "
          f"(results store {store_shown}, read-only; Ctrl-C stops)", flush=True)
    threading.Thread(target=_say_when_warm, args=(server.get_app().kubetune_details,), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        close()
    return 0


def _say_when_warm(details) -> None:
    """A big Experiment's page opens at once only after the warm-up: say when that is."""
    details.warmed.wait()
    print(f"kubetune dashboard: study pages ready ({details.warm_seconds:.1f} s to read and convert "
          "the trials)", flush=True)
