"""Mutual TLS between members: a cluster CA derived from the secret, a fresh node certificate per start.

The CA's Ed25519 key is derived from the cluster secret, and Ed25519 signatures are deterministic,
so every member computes the very same CA certificate without anything being distributed. Each
start makes a new node key and a certificate the CA signs. Zenoh (rustls) then accepts a link only
when both sides present a certificate of this CA: a host without the secret fails the handshake.
Names are not checked (nodes are found by address and by scouting); membership is what is checked.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

from .secret import ClusterSecret

_NOT_BEFORE = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
_NOT_AFTER = datetime.datetime(2100, 1, 1, tzinfo=datetime.UTC)


def _pem_cert(cert: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(cert.public_bytes(serialization.Encoding.PEM))


def _pem_key(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


def cluster_ca(cluster: ClusterSecret) -> tuple[Any, Any]:
    """(CA private key, CA certificate): the same on every member."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.x509.oid import NameOID

    key = ed25519.Ed25519PrivateKey.from_private_bytes(cluster.key("tls-ca-ed25519"))
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"skulk cluster {cluster.cluster_id}")])
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(int.from_bytes(cluster.key("tls-ca-serial")[:8], "big") | 1)
        .not_valid_before(_NOT_BEFORE)
        .not_valid_after(_NOT_AFTER)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, None)
    )
    return key, cert


def node_certificate(cluster: ClusterSecret, node_id: str) -> tuple[bytes, bytes, bytes]:
    """(CA pem, node certificate pem, node key pem) for one start of one node."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.x509.oid import NameOID

    ca_key, ca_cert = cluster_ca(cluster)
    key = ed25519.Ed25519PrivateKey.generate()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"skulk node {node_id}"[:64])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(min(now - datetime.timedelta(days=2), _NOT_AFTER))
        .not_valid_after(_NOT_AFTER)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("skulk-node")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, None)
    )
    return _pem_cert(ca_cert), _pem_cert(cert), _pem_key(key)


def zenoh_tls_config(cluster: ClusterSecret, node_id: str) -> dict[str, Any]:
    """The `transport/link/tls` table: mutual TLS, this cluster's CA only, no name check."""
    ca, cert, key = node_certificate(cluster, node_id)

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "root_ca_certificate_base64": b64(ca),
        "listen_certificate_base64": b64(cert),
        "listen_private_key_base64": b64(key),
        "connect_certificate_base64": b64(cert),
        "connect_private_key_base64": b64(key),
        "enable_mtls": True,
        "verify_name_on_connect": False,
    }


def secure_endpoint(endpoint: str) -> str:
    """``tcp/...`` -> ``tls/...``: a secured node listens and connects over TLS only."""
    return "tls/" + endpoint[4:] if endpoint.startswith("tcp/") else endpoint
