"""Mutual TLS material: a private CA, a server and a client certificate, and SSL contexts.

``fscache certs DIR`` calls :func:`make_certs`; ``fscache serve --tls DIR`` uses
:func:`server_context` (a client certificate signed by the CA is required) and clients
use :func:`client_context`. :func:`is_auth_failure` tells a refused certificate apart
from other broken connections, without importing trio.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
import ssl
from collections.abc import Iterator, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fscache.errors import FscacheError

CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
SERVER_CERT = "server.pem"
SERVER_KEY = "server-key.pem"
CLIENT_CERT = "client.pem"
CLIENT_KEY = "client-key.pem"
ALL_FILES = (CA_CERT, CA_KEY, SERVER_CERT, SERVER_KEY, CLIENT_CERT, CLIENT_KEY)

# OpenSSL reasons meaning "a certificate was refused" (by us or by the peer's alert).
_AUTH_REASONS = (
    "CERTIFICATE_VERIFY_FAILED",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED",
    "TLSV1_ALERT_UNKNOWN_CA",
    "TLSV1_ALERT_ACCESS_DENIED",
    "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_REVOKED",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
    "SSLV3_ALERT_NO_CERTIFICATE",
    "SSLV3_ALERT_HANDSHAKE_FAILURE",
)


def _write(path: pathlib.Path, data: bytes, mode: int) -> None:
    # O_EXCL: the file is born with ``mode`` (minus umask) and never widened later.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fscache"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _sign(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    extensions: Sequence[tuple[x509.ExtensionType, bool]],
    days: int,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))  # tolerate clock skew
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False
        )
    )
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical)
    return builder.sign(issuer_key, hashes.SHA256())


def _key_usage(*, sign_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certs,
        crl_sign=sign_certs,
        encipher_only=False,
        decipher_only=False,
    )


def make_certs(
    directory: str | os.PathLike[str],
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost", "::1"),
    client_name: str = "fscache-client",
    days: int = 825,
    overwrite: bool = False,
) -> list[pathlib.Path]:
    """Write a private CA, a server certificate for ``hosts`` and a client certificate.

    Keys are EC P-256, written with mode 0o600; the directory is created with mode
    0o700 if needed. Existing files are left alone (:class:`FscacheError`) unless
    ``overwrite`` is true. Returns the paths written, in :data:`ALL_FILES` order.
    """
    if not hosts:
        raise FscacheError("make_certs needs at least one host name or address")
    if days < 1:
        raise FscacheError(f"certificate validity must be at least one day, not {days}")
    root = pathlib.Path(directory)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = [root / name for name in ALL_FILES]
    existing = [p for p in paths if p.exists() or p.is_symlink()]
    if existing and not overwrite:
        names = ", ".join(p.name for p in existing)
        raise FscacheError(f"refusing to overwrite {names} in {root} (pass overwrite=True)")

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("fscache CA")
    ca = _sign(
        ca_name,
        ca_key,
        ca_name,
        ca_key,
        [
            (x509.BasicConstraints(ca=True, path_length=0), True),
            (_key_usage(sign_certs=True), True),
        ],
        days,
    )

    def leaf(
        common_name: str, usage: x509.ObjectIdentifier, extra: Sequence[x509.ExtensionType]
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        exts: list[tuple[x509.ExtensionType, bool]] = [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (_key_usage(sign_certs=False), True),
            (x509.ExtendedKeyUsage([usage]), False),
        ]
        exts += [(ext, False) for ext in extra]
        return _sign(_name(common_name), key, ca_name, ca_key, exts, days), key

    server, server_key = leaf(hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, [_san(hosts)])
    client, client_key = leaf(client_name, ExtendedKeyUsageOID.CLIENT_AUTH, [])

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    contents = [
        (ca.public_bytes(serialization.Encoding.PEM), 0o644),
        (pem_key(ca_key), 0o600),
        (server.public_bytes(serialization.Encoding.PEM), 0o644),
        (pem_key(server_key), 0o600),
        (client.public_bytes(serialization.Encoding.PEM), 0o644),
        (pem_key(client_key), 0o600),
    ]
    for path, (data, mode) in zip(paths, contents, strict=True):
        if overwrite:
            path.unlink(missing_ok=True)  # recreate, so an old wider mode is not kept
        _write(path, data, mode)
    return paths


def _material(directory: str | os.PathLike[str], *names: str) -> list[str]:
    root = pathlib.Path(directory)
    hint = f"run `fscache certs {root}` to create it"
    if not root.is_dir():
        raise FscacheError(f"TLS directory {root} does not exist; {hint}")
    paths = []
    for name in names:
        path = root / name
        try:
            with open(path, "rb"):
                pass
        except FileNotFoundError:
            raise FscacheError(f"missing TLS file {path}; {hint}") from None
        except OSError as exc:
            raise FscacheError(f"cannot read TLS file {path}: {exc.strerror or exc}") from exc
        paths.append(str(path))
    return paths


def _load(
    ctx: ssl.SSLContext, directory: str | os.PathLike[str], cert: str, key: str
) -> ssl.SSLContext:
    ca_path, cert_path, key_path = _material(directory, CA_CERT, cert, key)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_verify_locations(cafile=ca_path)
        ctx.load_cert_chain(cert_path, key_path)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise FscacheError(
            f"bad TLS material in {directory} ({exc}); run `fscache certs {directory}` again"
        ) from exc
    return ctx


def server_context(directory: str | os.PathLike[str]) -> ssl.SSLContext:
    """A TLS (>= 1.2) server context that requires a client certificate signed by the CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return _load(ctx, directory, SERVER_CERT, SERVER_KEY)


def client_context(directory: str | os.PathLike[str]) -> ssl.SSLContext:
    """A TLS (>= 1.2) client context trusting only the CA and presenting the client cert."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    ctx.check_hostname = True
    return _load(ctx, directory, CLIENT_CERT, CLIENT_KEY)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        cur = todo.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        todo += [e for e in (cur.__cause__, cur.__context__) if e is not None]


def is_auth_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or its ``__cause__``/``__context__`` chain) is a refused certificate.

    True for an :class:`ssl.SSLError` saying we refused the peer's certificate
    (verify failed, none sent) or the peer's alert says it refused ours (unknown CA,
    bad certificate, certificate required, handshake failure, ...). Wraps such as
    ``trio.BrokenResourceError`` are seen through. Other errors — EOF, resets, wrong
    protocol versions — are not auth failures.
    """
    for cur in _chain(exc):
        if isinstance(cur, ssl.SSLCertVerificationError):
            return True
        if not isinstance(cur, ssl.SSLError):
            continue
        if getattr(cur, "library", None) not in (None, "SSL"):
            continue
        reason = getattr(cur, "reason", None)
        text = (reason or str(cur)).upper().replace(" ", "_")
        if any(r in text for r in _AUTH_REASONS):
            return True
    return False
