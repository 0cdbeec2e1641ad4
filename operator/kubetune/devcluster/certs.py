"""The PKI of a throwaway control plane: one CA, the apiserver's serving
certificate, the service-account signing key and an admin client certificate.

EC P-256 keys: generating them is instant, and every component accepts them.
"""
from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# the first address of --service-cluster-ip-range: the `kubernetes` Service
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path        # private: kube-apiserver signs tokens, the controller manager too
    sa_pub: Path        # public: kube-apiserver verifies tokens
    admin_cert: Path
    admin_key: Path
    kubelet_client_cert: Path    # the apiserver's client certificate towards kubelets (logs, exec)
    kubelet_client_key: Path

    @classmethod
    def in_dir(cls, directory: Path) -> "Pki":
        return cls(*(directory / name for name in (
            "ca.crt", "ca.key", "apiserver.crt", "apiserver.key",
            "sa.key", "sa.pub", "admin.crt", "admin.key", "kubelet-client.crt", "kubelet-client.key",
        )))


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _builder(subject: x509.Name, issuer: x509.Name, public_key, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


def generate(directory: Path, *, days: int = 365, addresses: tuple[str, ...] = ()) -> Pki:
    """Write a fresh PKI into ``directory`` and return the paths; ``addresses``: more IP
    addresses the apiserver serves on (a node's bridge address)."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki.in_dir(directory)

    ca_key = _key()
    ca_name = _name("kubetune-devcluster-ca")
    ca_cert = (_builder(ca_name, ca_name, ca_key.public_key(), days)
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca_cert)

    def leaf(subject: x509.Name, usage, sans: list[x509.GeneralName] | None = None):
        key = _key()
        builder = (_builder(subject, ca_name, key.public_key(), days)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                                  critical=False))
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    serving_key, serving_cert = leaf(_name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address(KUBERNETES_SERVICE_IP)),
        *(x509.IPAddress(ipaddress.ip_address(address)) for address in addresses),
        *(x509.DNSName(name) for name in (
            "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local")),
    ])
    _write_key(pki.serving_key, serving_key)
    _write_cert(pki.serving_cert, serving_cert)

    # system:masters is bound to cluster-admin by the default RBAC policy
    admin_key, admin_cert = leaf(_name("admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH)
    _write_key(pki.admin_key, admin_key)
    _write_cert(pki.admin_cert, admin_cert)

    # kubelets accept it (their clientCAFile is this CA); system:masters for their webhook authorizer
    client_key, client_cert = leaf(_name("kube-apiserver-kubelet-client", "system:masters"),
                                   ExtendedKeyUsageOID.CLIENT_AUTH)
    _write_key(pki.kubelet_client_key, client_key)
    _write_cert(pki.kubelet_client_cert, client_cert)

    sa_key = _key()
    _write_key(pki.sa_key, sa_key)
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


def webhook_serving(directory: Path, *, days: int = 365) -> bytes:
    """A CA of its own and a serving certificate for 127.0.0.1, as ``tls.crt``/``tls.key``
    in ``directory`` (controller-runtime's webhook server reads these names); returns the
    CA certificate (PEM) the apiserver is given as the webhooks' ``caBundle``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("kubetune-webhook-ca")
    ca_cert = (_builder(ca_name, ca_name, ca_key.public_key(), days)
               .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
               .sign(ca_key, hashes.SHA256()))
    key = _key()
    cert = (_builder(_name("kueue-webhook"), ca_name, key.public_key(), days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_key(directory / "tls.key", key)
    _write_cert(directory / "tls.crt", cert)
    return ca_cert.public_bytes(serialization.Encoding.PEM)
