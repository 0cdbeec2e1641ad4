"""The node's cluster DNS: ``<service>.<namespace>.svc.cluster.local`` answered from
the API server, nothing else.

A small stand-in for CoreDNS's kubernetes plugin: A records of Services (the
ClusterIP, or the ready endpoint addresses of a headless Service); every other name
is NXDOMAIN at once (pods cannot reach anything outside the machine anyway, so
there is nothing to forward to).  UDP only: the answers are a few addresses, far
from the 512-byte limit.

    python -m kubetune.devcluster.node.dns --address 10.244.0.1 --kubeconfig K
"""
from __future__ import annotations

import argparse
import socketserver
import struct
import sys

DOMAIN = "cluster.local"
TYPE_A, TYPE_AAAA, TTL = 1, 28, 5
NOERROR, SERVFAIL, NXDOMAIN = 0, 2, 3


def parse_question(packet: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, name, qtype, end offset of the question)."""
    query_id, flags, count = struct.unpack("!HHH", packet[:6])
    if count != 1:
        raise ValueError("one question per query")
    labels, offset = [], 12
    while packet[offset]:
        length = packet[offset]
        labels.append(packet[offset + 1:offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length
    qtype, _ = struct.unpack("!HH", packet[offset + 1:offset + 5])
    return query_id, flags, ".".join(labels).lower().rstrip("."), qtype, offset + 5


def answer(packet: bytes, rcode: int, addresses: list[str]) -> bytes:
    query_id, flags, _, _, end = parse_question(packet)
    # QR, opcode copied, AA, RD copied, RA
    reply_flags = 0x8000 | (flags & 0x7800) | 0x0400 | (flags & 0x0100) | 0x0080 | rcode
    header = struct.pack("!HHHHHH", query_id, reply_flags, 1, len(addresses), 0, 0)
    records = b"".join(struct.pack("!HHHIH", 0xC00C, TYPE_A, 1, TTL, 4) + bytes(map(int, a.split(".")))
                       for a in addresses)
    return header + packet[12:end] + records


def service_name(name: str) -> tuple[str, str] | None:
    """``(service, namespace)`` for ``<service>.<namespace>.svc.cluster.local``."""
    suffix = f".svc.{DOMAIN}"
    if not name.endswith(suffix):
        return None
    parts = name[: -len(suffix)].split(".")
    return (parts[0], parts[1]) if len(parts) == 2 else None


class Resolver:
    def __init__(self, kubeconfig: str):
        from kubernetes import client, config
        self.core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.discovery = client.DiscoveryV1Api(self.core.api_client)

    def lookup(self, service: str, namespace: str) -> list[str] | None:
        from kubernetes.client.rest import ApiException
        try:
            found = self.core.read_namespaced_service(service, namespace, _request_timeout=3)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        if found.spec.cluster_ip and found.spec.cluster_ip != "None":
            return [found.spec.cluster_ip]
        slices = self.discovery.list_namespaced_endpoint_slice(
            namespace, label_selector=f"kubernetes.io/service-name={service}", _request_timeout=3)
        return sorted({address for item in slices.items for endpoint in item.endpoints or []
                       if (endpoint.conditions is None or endpoint.conditions.ready is not False)
                       for address in endpoint.addresses or []})


def respond(resolver: Resolver, packet: bytes) -> bytes:
    _, _, name, qtype, _ = parse_question(packet)
    target = service_name(name)
    if target is None:
        return answer(packet, NXDOMAIN, [])
    try:
        addresses = resolver.lookup(*target)
    except Exception:   # the API is unreachable: let the resolver retry
        return answer(packet, SERVFAIL, [])
    if addresses is None:
        return answer(packet, NXDOMAIN, [])
    return answer(packet, NOERROR, addresses if qtype == TYPE_A else [])


def serve(address: str, port: int, kubeconfig: str) -> None:
    resolver = Resolver(kubeconfig)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            packet, sock = self.request
            try:
                sock.sendto(respond(resolver, packet), self.client_address)
            except (ValueError, IndexError, struct.error):
                pass    # not a query we understand: no answer

    socketserver.ThreadingUDPServer.allow_reuse_address = True
    with socketserver.ThreadingUDPServer((address, port), Handler) as server:
        print(f"dns: serving *.svc.{DOMAIN} on {address}:{port}", flush=True)
        server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, default=53)
    parser.add_argument("--kubeconfig", required=True)
    args = parser.parse_args(argv)
    serve(args.address, args.port, args.kubeconfig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
