"""The pure parts of the real node: the cluster DNS wire format, the egress guard's
rules, image cache keys."""
from __future__ import annotations

import struct

from kubetune.devcluster.node import dns, images, network


def query(name: str, qtype: int = dns.TYPE_A, query_id: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.split("."))
    return struct.pack("!HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, 1)


class FakeResolver:
    """Services by (name, namespace): what the API server would answer."""

    def __init__(self, services: dict[tuple[str, str], list[str]], broken: bool = False):
        self.services, self.broken = services, broken

    def lookup(self, service: str, namespace: str):
        if self.broken:
            raise ConnectionError("apiserver down")
        return self.services.get((service, namespace))


def decode(reply: bytes) -> tuple[int, int, list[str]]:
    query_id, flags, _, count, _, _ = struct.unpack("!HHHHHH", reply[:12])
    offset = 12
    while reply[offset]:
        offset += 1 + reply[offset]
    offset += 5
    addresses = []
    for _ in range(count):
        _, rtype, _, _, length = struct.unpack("!HHHIH", reply[offset:offset + 12])
        assert rtype == dns.TYPE_A and length == 4
        addresses.append(".".join(map(str, reply[offset + 12:offset + 16])))
        offset += 12 + length
    return query_id, flags & 0xF, addresses


def test_a_service_name_resolves_to_its_cluster_ip():
    resolver = FakeResolver({("kubetune-ingest", "kubetune-system"): ["10.0.0.12"]})
    reply = dns.respond(resolver, query("kubetune-ingest.kubetune-system.svc.cluster.local"))
    assert decode(reply) == (0x1234, dns.NOERROR, ["10.0.0.12"])
    # AAAA: the name exists, with no IPv6 address (the resolver stops asking)
    assert decode(dns.respond(resolver, query("kubetune-ingest.kubetune-system.svc.cluster.local",
                                              dns.TYPE_AAAA)))[1:] == (dns.NOERROR, [])


def test_anything_else_is_nxdomain_and_an_api_outage_servfail():
    resolver = FakeResolver({("a", "b"): ["10.0.0.3"]})
    for name in ("pypi.org", "a.b.svc.cluster.local.example.com", "missing.b.svc.cluster.local",
                 "a.svc.cluster.local", "x.a.b.svc.cluster.local"):
        assert decode(dns.respond(resolver, query(name)))[1] == dns.NXDOMAIN, name
    assert decode(dns.respond(FakeResolver({}, broken=True), query("a.b.svc.cluster.local")))[1] == dns.SERVFAIL


def test_a_headless_service_resolves_to_its_endpoints():
    resolver = FakeResolver({("head", "ray"): ["10.244.0.7", "10.244.0.9"]})
    assert decode(dns.respond(resolver, query("head.ray.svc.cluster.local")))[2] == ["10.244.0.7", "10.244.0.9"]


def test_the_guard_drops_pod_traffic_that_leaves_the_bridge():
    rules = [" ".join(rule) for rule in network.guard_rules()]
    assert f"-s {network.POD_CIDR} ! -o {network.BRIDGE} -j DROP" in rules
    assert f"-d {network.POD_CIDR} ! -i {network.BRIDGE} -j DROP" in rules
    bridge = network.cni_config(__import__("pathlib").Path("/x"))["plugins"][0]
    assert bridge["ipMasq"] is False and bridge["bridge"] == network.BRIDGE


def test_image_keys_follow_content(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("1")
    (tmp_path / "Dockerfile").write_text("FROM x")
    before = images.tree_digest(tmp_path, ["Dockerfile", "src"])
    (tmp_path / "src" / "__pycache__").mkdir()
    (tmp_path / "src" / "__pycache__" / "a.pyc").write_bytes(b"junk")
    # `pip install -e` rewrites the egg-info; .dockerignore keeps it out of the image
    (tmp_path / "src" / "pkg.egg-info").mkdir()
    (tmp_path / "src" / "pkg.egg-info" / "SOURCES.txt").write_text("a.py")
    assert images.tree_digest(tmp_path, ["Dockerfile", "src"]) == before
    (tmp_path / "src" / "a.py").write_text("2")
    assert images.tree_digest(tmp_path, ["Dockerfile", "src"]) != before
    python = images.Image("python:3.11-slim", "k1", lambda *_: None)
    assert images.operator_image(python).key != images.operator_image(
        images.Image("python:3.11-slim", "k2", lambda *_: None)).key
    assert python.family == "python"
    # the Ray image carries kubetune too, on the stand-in for rayproject/ray
    ray = images.ray_image(python)
    assert ray.key != images.ray_image(images.Image("python:3.11-slim", "k2", lambda *_: None)).key
    assert [parent.name for parent in ray.parents] == ["python:3.11-slim",
                                                       f"kubetune-ray-base:{images.dockerfile_arg('RAY_VERSION')}-py311"]


def test_a_replaced_build_leaves_buildahs_storage_with_its_archive(tmp_path):
    """A new key per code change: the old image goes from storage when its archive goes,
    and only that family's image of that key (not another family's, not the new one)."""
    builder = images.Builder(tmp_path)
    calls: list[tuple[str, ...]] = []

    def buildah(*args: str, **_) -> str:
        calls.append(args)
        if args[0] == "images":
            return "\n".join(["localhost/kubetune:dev-old1", "localhost/kubetune:dev-new2",
                              "localhost/kubetune-ray:dev-old1", "localhost/python:3.11-slim"])
        return ""
    builder.buildah = buildah
    builder._remove_images("kubetune", "old1")
    assert [c for c in calls if c[0] == "rmi"] == [("rmi", "--force", "localhost/kubetune:dev-old1")]
