"""Mutual TLS material: a private CA, one bundle per role, SSL contexts and identities.

``fscache certs DIR`` calls :func:`make_certs`, which keeps the CA's key apart and
gives each role a bundle holding its own key and nothing else::

    DIR/ca/               ca.pem, ca-key.pem           (mode 0700: stays with whoever mints)
    DIR/server/           ca.pem, server.pem, server-key.pem
    DIR/clients/NAME/     ca.pem, client.pem, client-key.pem

``fscache certs DIR --client NAME`` adds a client bundle later, signed by the existing
CA, touching nothing else. ``fscache serve --tls DIR/server`` uses
:func:`server_context` (a client certificate signed by the CA is required); clients use
:func:`client_context` on their own bundle. A directory of the older flat layout (every
file in one place) still loads, since a bundle's file names are the same.

A client's identity is the name its certificate carries (:func:`peer_identity`); the
server's access rules (:mod:`fscache.access`) are written in those names.
:func:`is_auth_failure` tells a refused certificate apart from other broken
connections, without importing trio.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
import re
import ssl
from collections.abc import Iterator, Sequence
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fscache.access import ANONYMOUS
from fscache.errors import FscacheError, Unauthorized

CA_DIR = "ca"
SERVER_DIR = "server"
CLIENTS_DIR = "clients"
CA_CERT = "ca.pem"
CA_KEY = "ca-key.pem"
SERVER_CERT = "server.pem"
SERVER_KEY = "server-key.pem"
CLIENT_CERT = "client.pem"
CLIENT_KEY = "client-key.pem"
CA_FILES = (CA_CERT, CA_KEY)
SERVER_FILES = (CA_CERT, SERVER_CERT, SERVER_KEY)
CLIENT_FILES = (CA_CERT, CLIENT_CERT, CLIENT_KEY)

# A client name is its identity and its bundle's directory name: no '/', no dot first.
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

# A server's DNS name, as a certificate carries it (RFC 1123 labels, ASCII: an
# internationalised name is given as its xn-- form); the first label may be "*".
_DNS_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_DNS_NAME_MAX = 253
_COMMON_NAME_MAX = 64  # X.509's upper bound; the SANs, which clients check, hold any name
_SERVER_COMMON_NAME = "fscache server"  # when the first host name is longer than that

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


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


class _CA:
    """The CA's certificate and key, able to sign leaf certificates."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def new(cls, days: int) -> _CA:
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name("fscache CA")
        extensions: list[tuple[x509.ExtensionType, bool]] = [
            (x509.BasicConstraints(ca=True, path_length=0), True),
            (_key_usage(sign_certs=True), True),
        ]
        return cls(_sign(name, key, name, key, extensions, days), key)

    @classmethod
    def load(cls, directory: pathlib.Path) -> _CA:
        try:
            cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
            key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
        except (OSError, ValueError) as exc:
            raise FscacheError(f"cannot load the CA in {directory}: {exc}") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise FscacheError(f"the CA key in {directory} is not an EC key")
        return cls(cert, key)

    def leaf(
        self, common_name: str, usage: x509.ObjectIdentifier, extra: Sequence[x509.ExtensionType]
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A certificate for ``common_name`` usable only for ``usage``, and its key."""
        key = ec.generate_private_key(ec.SECP256R1())
        extensions: list[tuple[x509.ExtensionType, bool]] = [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (_key_usage(sign_certs=False), True),
            (x509.ExtendedKeyUsage([usage]), False),
        ]
        extensions += [(ext, False) for ext in extra]
        days = (self.cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)).days
        cert = _sign(_name(common_name), key, self.cert.subject, self.key, extensions, days)
        return cert, key


def _write_bundle(
    directory: pathlib.Path, files: Sequence[str], contents: Sequence[bytes], overwrite: bool
) -> list[pathlib.Path]:
    """Write ``files`` into ``directory`` (mode 0700); ``*-key.pem`` files get mode 0600."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    paths = [directory / name for name in files]
    existing = [p for p in paths if p.exists() or p.is_symlink()]
    if existing and not overwrite:
        names = ", ".join(p.name for p in existing)
        raise FscacheError(f"refusing to overwrite {names} in {directory} (pass --force)")
    for path, data in zip(paths, contents, strict=True):
        if overwrite:
            path.unlink(missing_ok=True)  # recreate, so an old wider mode is not kept
        _write(path, data, 0o600 if path.name.endswith("-key.pem") else 0o644)
    return paths


def check_client_name(name: str) -> str:
    """``name`` if it can name a client (its identity and its bundle's directory)."""
    if not _CLIENT_NAME.fullmatch(name) or name == ANONYMOUS:
        raise FscacheError(
            f"client name {name!r} must be 1..64 of A-Z a-z 0-9 . _ - (not starting with"
            f" . _ -) and not {ANONYMOUS!r}, the identity of connections without TLS"
        )
    return name


def check_host_name(host: str) -> str:
    """``host`` if a server certificate can name it: an IP address (an IPv6 one may
    come in brackets, which are taken off) or a DNS name."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        return bare
    labels = host.split(".")
    if labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    if (
        len(host) > _DNS_NAME_MAX
        or not all(_DNS_LABEL.fullmatch(label) for label in labels)
        or labels[-1].isdigit()  # 10.0.0.256: an address mistyped, no top-level domain
    ):
        raise FscacheError(
            f"server name {host!r} must be an IP address or a DNS name: labels of 1..63 of"
            " A-Z a-z 0-9 - (not starting or ending with -) joined by dots, 253 at most,"
            " the first of which may be *"
        )
    return host


def make_certs(
    directory: str | os.PathLike[str],
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost", "::1"),
    clients: Sequence[str] = (),
    days: int = 825,
    overwrite: bool = False,
) -> list[pathlib.Path]:
    """Make the CA and the server's bundle in ``directory``, and a bundle per client.

    Without a CA in ``DIR/ca`` (or with ``overwrite``), a new CA and a server bundle for
    ``hosts`` are made first; with one, the named ``clients`` are signed by it and
    nothing else is touched. Keys are EC P-256 with mode 0o600, directories mode
    0o700. Existing files are left alone (:class:`FscacheError`) unless ``overwrite``
    is true (a new CA invalidates every bundle not made again with it). Returns the
    paths written.
    """
    if days < 1:
        raise FscacheError(f"certificate validity must be at least one day, not {days}")
    hosts = [check_host_name(host) for host in hosts]
    for name in clients:
        check_client_name(name)
    root = pathlib.Path(directory)
    if root.exists() and not root.is_dir():
        raise FscacheError(f"cannot make certificates in {root}: it is not a directory")
    try:
        return _make_certs(root, hosts, clients, days, overwrite)
    except OSError as exc:  # a file where a directory goes, no permission, a full disk
        where = exc.filename or root
        raise FscacheError(f"cannot make certificates in {root}: {where}: {exc.strerror}") from None


def _make_certs(
    root: pathlib.Path, hosts: Sequence[str], clients: Sequence[str], days: int, overwrite: bool
) -> list[pathlib.Path]:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca_dir = root / CA_DIR
    written: list[pathlib.Path] = []
    if (ca_dir / CA_KEY).exists() and not overwrite:
        if not clients:
            raise FscacheError(
                f"a CA already exists in {ca_dir}; add a client with --client NAME,"
                " or pass --force to overwrite it with a new CA and server bundle"
            )
        ca = _CA.load(ca_dir)
    else:
        if not hosts:
            raise FscacheError("make_certs needs at least one host name or address")
        ca = _CA.new(days)
        ca_pem = _pem_cert(ca.cert)
        written += _write_bundle(ca_dir, CA_FILES, [ca_pem, _pem_key(ca.key)], overwrite)
        common_name = hosts[0] if len(hosts[0]) <= _COMMON_NAME_MAX else _SERVER_COMMON_NAME
        server, server_key = ca.leaf(common_name, ExtendedKeyUsageOID.SERVER_AUTH, [_san(hosts)])
        written += _write_bundle(
            root / SERVER_DIR,
            SERVER_FILES,
            [ca_pem, _pem_cert(server), _pem_key(server_key)],
            overwrite,
        )
    for name in clients:
        client, client_key = ca.leaf(name, ExtendedKeyUsageOID.CLIENT_AUTH, [])
        written += _write_bundle(
            root / CLIENTS_DIR / name,
            CLIENT_FILES,
            [_pem_cert(ca.cert), _pem_cert(client), _pem_key(client_key)],
            overwrite,
        )
    return written


def _material(directory: str | os.PathLike[str], *names: str) -> list[str]:
    root = pathlib.Path(directory)
    if (root / SERVER_DIR).is_dir() or (root / CLIENTS_DIR).is_dir():
        hint = f"{root} holds every bundle: pass {root / SERVER_DIR} or {root / CLIENTS_DIR}/NAME"
    elif CLIENT_CERT in names and (root / SERVER_CERT).exists():
        hint = f"{root} is the server's bundle: a client passes its own, CERTS/clients/NAME"
    elif SERVER_CERT in names and (root / CLIENT_CERT).exists():
        hint = f"{root} is a client's bundle: the server passes its own, CERTS/server"
    else:
        hint = "make bundles with `fscache certs DIR [--client NAME]`"
    if not root.is_dir():
        raise FscacheError(f"TLS bundle {root} does not exist; {hint}")
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
            f"bad TLS material in {directory} ({exc}); make the bundle again with `fscache certs`"
        ) from exc
    return ctx


def server_context(directory: str | os.PathLike[str]) -> ssl.SSLContext:
    """A TLS (>= 1.2) server context from the server's bundle ``directory`` that requires
    a client certificate signed by the CA."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.verify_mode = ssl.CERT_REQUIRED
    _load(ctx, directory, SERVER_CERT, SERVER_KEY)
    _check_server_use(pathlib.Path(directory) / SERVER_CERT)
    return ctx


def _check_server_use(path: pathlib.Path) -> None:
    """Refuse a certificate whose extended key usage leaves out serverAuth (a client's
    bundle copied in as the server's): every client would refuse it, each handshake
    failing far from the cause. A certificate with no such extension may serve any
    use, and TLS clients accept it as a server's."""
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return
    except (OSError, ValueError) as exc:
        raise FscacheError(f"bad TLS material in {path} ({exc})") from exc
    if ExtendedKeyUsageOID.SERVER_AUTH not in usage:
        raise FscacheError(
            f"{path} is not a server certificate (its extended key usage has no"
            " serverAuth; a client's?): pass the server bundle, CERTS/server, made by"
            " `fscache certs`"
        )


def client_context(directory: str | os.PathLike[str]) -> ssl.SSLContext:
    """A TLS (>= 1.2) client context from a client's bundle ``directory``: it trusts
    only the CA and presents that client's certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    ctx.check_hostname = True
    return _load(ctx, directory, CLIENT_CERT, CLIENT_KEY)


def peer_identity(cert: dict[str, Any] | None) -> str | None:
    """The identity a peer's certificate names (``SSLStream.getpeercert()`` after the
    handshake): its subject's common name, else its first DNS or URI alternative name;
    None without a certificate."""
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    for kind, value in cert.get("subjectAltName", ()):
        if kind in ("DNS", "URI"):
            return str(value)
    return None


def ssl_error_in(exc: BaseException) -> ssl.SSLError | None:
    """The first :class:`ssl.SSLError` in ``exc``'s ``__cause__``/``__context__`` chain
    (trio wraps TLS failures in its stream errors), or None."""
    return next((cur for cur in _chain(exc) if isinstance(cur, ssl.SSLError)), None)


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


class CredentialsRefused(Unauthorized):
    """TLS refused a certificate during the handshake: the server refused our client
    certificate, or we refused the server's (not signed by our bundle's CA, or not
    naming the host we connected to). An :class:`Unauthorized` of its own, because a
    refused certificate is fixed where the bundles are made, while a request that
    the access rules refuse (a plain Unauthorized, with credentials that were
    accepted) is fixed in the rules: the command line exits 4 for this one and 1
    for that one."""


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
