"""Bearer tokens (none / wrong / read-only writing: refused) and TLS (works; plaintext refused)."""

from __future__ import annotations

import datetime
import ipaddress

import numpy as np
import pytest

from simsearch.service.errors import (
    AuthenticationError,
    PermissionDeniedError,
    ServiceUnavailableError,
)

DIM = 4
RW, RO = "rw-" + "a" * 32, "ro-" + "b" * 32


def test_tokens(server_factory, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# role token\nread-write {RW}\n\nread-only {RO}\n")
    server = server_factory("--tokens-file", str(tokens), "--reflection")
    rw = server.client(token=RW, timeout=10)
    col = rw.create_collection("secret", DIM, "l2", "flat")
    col.add(np.eye(DIM))
    assert len(col) == DIM

    for bad in (None, "wrong-token", RW + "x"):
        c = server.client(token=bad, timeout=10)
        with pytest.raises(AuthenticationError):
            c.list_collections()
        with pytest.raises(AuthenticationError):
            c._call("Search", c._pb.SearchRequest(collection="secret", k=1))
        assert c.health() == "SERVING"  # probes need no token
        c.close()

    ro = server.client(token=RO, timeout=10)
    ro_col = ro.collection("secret")
    assert ro_col.search(np.eye(DIM)[:1], 1).ids[0, 0] == 0  # reading is allowed
    for write in (
        lambda: ro_col.add(np.ones((1, DIM))),
        lambda: ro_col.remove([0]),
        ro_col.snapshot,
        lambda: ro.drop_collection("secret"),
        lambda: ro.create_collection("other", DIM),
    ):
        with pytest.raises(PermissionDeniedError):
            write()
    assert len(col) == DIM and rw.list_collections() == ["secret"]

    # reflection (asked for with --reflection) lists the services, behind the token too
    import grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(server.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        resp = next(
            stub.ServerReflectionInfo(
                iter([req]), timeout=10, metadata=(("authorization", f"Bearer {RO}"),)
            )
        )
        names = {s.name for s in resp.list_services_response.service}
        assert {"simsearch.v1.SimSearch", "grpc.health.v1.Health"} <= names
        with pytest.raises(grpc.RpcError) as ei:
            next(stub.ServerReflectionInfo(iter([req]), timeout=10))
        assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert server.stop() == 0


def _self_signed(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls(server_factory, tmp_path):
    pytest.importorskip("cryptography")
    cert, key = _self_signed(tmp_path)
    server = server_factory("--tls-cert", str(cert), "--tls-key", str(key))
    c = server.client(tls_ca=cert, timeout=10)
    col = c.create_collection("tls", DIM, "ip", "flat")
    col.add(np.eye(DIM))
    assert col.search(np.eye(DIM)[2], 1).ids[0, 0] == 2
    assert c.health() == "SERVING"

    plain = server.client(timeout=3)
    with pytest.raises(ServiceUnavailableError):
        plain.list_collections()
    other = tmp_path / "other"
    other.mkdir()
    other_cert, _ = _self_signed(other)
    stranger = server.client(tls_ca=other_cert, timeout=3)  # a CA that did not sign the server
    with pytest.raises(ServiceUnavailableError):
        stranger.list_collections()
    assert server.stop() == 0
