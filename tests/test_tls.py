"""Mutual TLS: certificate bundles per role, identities, and real handshakes over TCP
(``docs/design.md``, "Security").

Test rules: real sockets, because TLS is the point; 127.0.0.1 only, every listener
on port 0; no sleeps; every handshake runs under a ``trio.fail_after`` of several
seconds, a guard against a hang, never a timing assertion.
"""

from __future__ import annotations

import contextlib
import datetime
import pathlib
import socket
import ssl
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fscache.errors import FscacheError
from fscache.tls import (
    CA_CERT,
    CA_FILES,
    CA_KEY,
    CLIENT_CERT,
    CLIENT_FILES,
    CLIENT_KEY,
    SERVER_CERT,
    SERVER_FILES,
    SERVER_KEY,
    client_context,
    is_auth_failure,
    make_certs,
    peer_identity,
    server_context,
)


class Bundles:
    """A certificate directory: ``.server`` and ``.client`` (alice's) are bundles."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.server = root / "server"
        self.client = root / "clients" / "alice"

    def of(self, name: str) -> pathlib.Path:
        return self.root / "clients" / name


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Bundles:
    directory = tmp_path_factory.mktemp("tls") / "certs"
    make_certs(directory, clients=["alice", "bob"])
    return Bundles(directory)


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Bundles:
    directory = tmp_path_factory.mktemp("tls-other") / "certs"
    make_certs(directory, clients=["alice"])
    return Bundles(directory)


class Server:
    def __init__(self, port: int) -> None:
        self.port = port
        self.errors: list[BaseException] = []
        self.done = trio.Event()  # set after each connection is handled
        self.identities: list[str | None] = []  # of each client that completed a handshake


@asynccontextmanager
async def echo_server(
    directory: pathlib.Path, ctx: ssl.SSLContext | None = None
) -> AsyncIterator[Server]:
    """An mTLS echo server on 127.0.0.1 (the bundle ``directory``, or ``ctx``);
    handshake/IO errors are recorded, not raised."""
    ctx = ctx or server_context(directory)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    server = Server(listeners[0].socket.getsockname()[1])

    async def handle(tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, ctx, server_side=True)
        try:
            async with stream:
                await stream.do_handshake()
                server.identities.append(peer_identity(stream.getpeercert()))
                while data := await stream.receive_some():
                    await stream.send_all(data)
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            server.errors.append(exc)
        finally:
            server.done.set()

    async with trio.open_nursery() as nursery:
        try:
            await nursery.start(trio.serve_listeners, handle, listeners)
            yield server
        finally:
            nursery.cancel_scope.cancel()


async def refused(port: int, ctx: ssl.SSLContext) -> BaseException:
    """Connect, handshake, read: return the error the client sees (it must see one)."""
    stream = await trio.open_ssl_over_tcp_stream("127.0.0.1", port, ssl_context=ctx)
    try:
        async with stream:
            await stream.do_handshake()  # TLS 1.3: may succeed before the server checks us
            data = await stream.receive_some()
    except (trio.BrokenResourceError, ssl.SSLError) as exc:
        return exc
    raise AssertionError(f"server did not refuse the client (read {data!r})")


def mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_make_certs_writes_one_bundle_per_role_with_only_its_own_key(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "new"
    paths = make_certs(root, clients=["alice", "bob"])
    expected = (
        [root / "ca" / name for name in CA_FILES]
        + [root / "server" / name for name in SERVER_FILES]
        + [root / "clients" / who / name for who in ("alice", "bob") for name in CLIENT_FILES]
    )
    assert paths == expected
    assert sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file()) == sorted(
        p.relative_to(root) for p in expected
    )
    keys = {
        p.parent.relative_to(root).as_posix(): p.name for p in paths if p.name.endswith("-key.pem")
    }
    assert keys == {
        "ca": CA_KEY, "server": SERVER_KEY, "clients/alice": CLIENT_KEY, "clients/bob": CLIENT_KEY
    }  # fmt: skip
    for p in paths:
        assert mode(p) == (0o600 if p.name.endswith("-key.pem") else 0o644), p
    for d in (root, root / "ca", root / "server", root / "clients" / "alice"):
        assert mode(d) == 0o700, d

    ca = x509.load_pem_x509_certificate((root / "ca" / CA_CERT).read_bytes())
    server = x509.load_pem_x509_certificate((root / "server" / SERVER_CERT).read_bytes())
    alice = x509.load_pem_x509_certificate((root / "clients" / "alice" / CLIENT_CERT).read_bytes())
    for bundle in (root / "server", root / "clients" / "alice"):
        assert (bundle / CA_CERT).read_bytes() == (root / "ca" / CA_CERT).read_bytes()
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    server.verify_directly_issued_by(ca)
    alice.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    eku = x509.oid.ExtendedKeyUsageOID
    assert list(server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        eku.SERVER_AUTH
    ]
    assert list(alice.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        eku.CLIENT_AUTH
    ]
    assert not alice.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not alice.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign


def test_a_client_is_added_later_with_the_same_ca_and_nothing_else_touched(
    tmp_path: pathlib.Path,
) -> None:
    make_certs(tmp_path, clients=["alice"])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    written = make_certs(tmp_path, clients=["carol"])
    assert written == [tmp_path / "clients" / "carol" / name for name in CLIENT_FILES]
    assert {p: p.read_bytes() for p in before} == before
    ca = x509.load_pem_x509_certificate((tmp_path / "ca" / CA_CERT).read_bytes())
    carol = tmp_path / "clients" / "carol"
    x509.load_pem_x509_certificate((carol / CLIENT_CERT).read_bytes()).verify_directly_issued_by(ca)
    client_context(carol)


def test_make_certs_refuses_to_overwrite(tmp_path: pathlib.Path) -> None:
    make_certs(tmp_path, clients=["alice"])
    key = tmp_path / "clients" / "alice" / CLIENT_KEY
    before = key.read_bytes()
    with pytest.raises(FscacheError, match="overwrite"):
        make_certs(tmp_path)  # a CA exists and no client was asked for
    with pytest.raises(FscacheError, match="overwrite"):
        make_certs(tmp_path, clients=["alice"])
    assert key.read_bytes() == before

    key.chmod(0o644)  # an old, too-wide mode is not kept
    make_certs(tmp_path, clients=["alice"], overwrite=True)
    assert key.read_bytes() != before
    assert mode(key) == 0o600


@pytest.mark.parametrize("name", ["", "a/b", "..", ".hidden", "anonymous", "x" * 65, "é"])
def test_bad_client_names_are_refused(tmp_path: pathlib.Path, name: str) -> None:
    with pytest.raises(FscacheError, match="client name"):
        make_certs(tmp_path, clients=[name])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "host", ["bad host!", "", "café.example", "a..b", "-a.com", "a_b.com", "10.0.0.256",
             "x" * 64 + ".com", "a." * 127 + "com", "*", "a.*.com"],
)  # fmt: skip
def test_bad_host_names_are_refused_before_anything_is_written(
    tmp_path: pathlib.Path, host: str
) -> None:
    with pytest.raises(FscacheError, match="must be an IP address or a DNS name"):
        make_certs(tmp_path, hosts=["localhost", host])
    assert list(tmp_path.iterdir()) == []


def test_certs_with_a_bad_host_is_bad_usage(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fscache", "certs", str(tmp_path / "c"), "--host", "bad host!"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith(
        "fscache certs: error: argument --host: server name 'bad host!' must be an IP address"
    )
    assert not (tmp_path / "c").exists()


def test_a_server_certificate_names_every_host_in_its_alternative_names(
    tmp_path: pathlib.Path,
) -> None:
    """The common name holds 64 characters at most; the alternative names, which a
    client checks, hold any DNS name. An IPv6 address may come in brackets."""
    long_name = "a" * 60 + "." + "b" * 60
    make_certs(tmp_path, hosts=[long_name, "*.example.com", "[::1]", "10.1.2.3"])
    cert = x509.load_pem_x509_certificate((tmp_path / "server" / "server.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [long_name, "*.example.com"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["::1", "10.1.2.3"]
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == (
        "fscache server"
    )


def test_the_old_flat_layout_still_loads(tmp_path: pathlib.Path, certs: Bundles) -> None:
    for bundle in (certs.server, certs.client):
        for f in bundle.iterdir():
            (tmp_path / f.name).write_bytes(f.read_bytes())
    server_context(tmp_path)
    client_context(tmp_path)


def test_the_top_directory_is_not_a_bundle(certs: Bundles) -> None:
    with pytest.raises(FscacheError, match=r"pass .*server or .*clients/NAME"):
        server_context(certs.root)


def test_contexts_settings(certs: Bundles) -> None:
    server = server_context(certs.server)
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert server.minimum_version >= ssl.TLSVersion.TLSv1_2
    client = client_context(certs.client)
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    assert client.minimum_version >= ssl.TLSVersion.TLSv1_2


async def test_mutual_tls_round_trip(certs: Bundles) -> None:
    with trio.fail_after(10):
        async with echo_server(certs.server) as server:
            stream = await trio.open_ssl_over_tcp_stream(
                "127.0.0.1", server.port, ssl_context=client_context(certs.client)
            )
            async with stream:
                await stream.do_handshake()
                await stream.send_all(b"hello over mTLS")
                received = b""
                while len(received) < len(b"hello over mTLS"):
                    received += await stream.receive_some()
                assert received == b"hello over mTLS"
                assert stream.getpeercert() is not None
            await server.done.wait()
            assert server.errors == []


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
async def test_hostname_and_ip_sans_verify(certs: Bundles, host: str) -> None:
    with trio.fail_after(10):
        async with echo_server(certs.server) as server:
            stream = await trio.open_ssl_over_tcp_stream(
                host, server.port, ssl_context=client_context(certs.client)
            )
            async with stream:
                await stream.do_handshake()
                await stream.send_all(b"x")
                assert await stream.receive_some() == b"x"


async def test_client_without_certificate_is_refused(certs: Bundles) -> None:
    with trio.fail_after(10):
        async with echo_server(certs.server) as server:
            anonymous = ssl.create_default_context(cafile=str(certs.client / CA_CERT))
            client_error = await refused(server.port, anonymous)
            await server.done.wait()
            # The server refused: it knows why. (trio does not flush the TLS alert
            # before closing, so the client may only see an abrupt EOF.)
            assert len(server.errors) == 1
            assert is_auth_failure(server.errors[0]), repr(server.errors[0].__cause__)
            assert isinstance(client_error, trio.BrokenResourceError | ssl.SSLError)


async def test_client_from_another_ca_is_refused(certs: Bundles, other_certs: Bundles) -> None:
    with trio.fail_after(10):
        async with echo_server(certs.server) as server:
            client_error = await refused(server.port, client_context(other_certs.client))
            await server.done.wait()
            # The client trusts only its own CA, so it refuses the server's certificate.
            assert is_auth_failure(client_error), repr(client_error.__cause__)
            assert len(server.errors) == 1


async def test_server_refuses_a_client_cert_from_another_ca(
    certs: Bundles, other_certs: Bundles
) -> None:
    # The client trusts the right CA but presents a certificate signed by another one.
    ctx = ssl.create_default_context(cafile=str(certs.client / CA_CERT))
    ctx.load_cert_chain(other_certs.client / CLIENT_CERT, other_certs.client / CLIENT_KEY)
    with trio.fail_after(10):
        async with echo_server(certs.server) as server:
            client_error = await refused(server.port, ctx)
            await server.done.wait()
            assert len(server.errors) == 1
            assert is_auth_failure(server.errors[0]), repr(server.errors[0].__cause__)
            assert isinstance(client_error, trio.BrokenResourceError | ssl.SSLError)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
@pytest.mark.parametrize("client_cert", ["none", "other-ca"])
async def test_refusal_alert_from_a_stdlib_server_is_an_auth_failure(
    certs: Bundles, other_certs: Bundles, version: ssl.TLSVersion, client_cert: str
) -> None:
    # Unlike trio, a blocking stdlib server sends its alert, so the client learns why.
    ctx = ssl.create_default_context(cafile=str(certs.client / CA_CERT))
    ctx.maximum_version = version
    if client_cert == "other-ca":
        ctx.load_cert_chain(other_certs.client / CLIENT_CERT, other_certs.client / CLIENT_KEY)
    server_errors: list[BaseException] = []

    def serve_one(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        with conn:
            try:
                with server_context(certs.server).wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except ssl.SSLError as exc:
                server_errors.append(exc)

    with trio.fail_after(10), socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, serve_one, listener)
            client_error = await refused(listener.getsockname()[1], ctx)
        assert is_auth_failure(client_error), repr(client_error.__cause__)
        assert len(server_errors) == 1 and is_auth_failure(server_errors[0])


def test_is_auth_failure_ignores_other_errors() -> None:
    eof = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    broken = trio.BrokenResourceError()
    broken.__cause__ = eof
    assert not is_auth_failure(broken)
    assert not is_auth_failure(ConnectionResetError())
    assert not is_auth_failure(ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version"))
    wrapped = trio.BrokenResourceError()
    wrapped.__cause__ = ssl.SSLError(1, "[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca")
    assert is_auth_failure(wrapped)
    cyclic = ValueError()
    cyclic.__context__ = cyclic
    assert not is_auth_failure(cyclic)


def test_missing_directory_names_the_command(tmp_path: pathlib.Path) -> None:
    for make in (server_context, client_context):
        with pytest.raises(FscacheError, match="fscache certs"):
            make(tmp_path / "nowhere")


def test_missing_file_is_named(tmp_path: pathlib.Path) -> None:
    make_certs(tmp_path, clients=["a"])
    (tmp_path / "clients" / "a" / CLIENT_KEY).unlink()
    with pytest.raises(FscacheError, match=rf"{CLIENT_KEY}.*fscache certs"):
        client_context(tmp_path / "clients" / "a")


def test_corrupt_file_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    make_certs(tmp_path)
    (tmp_path / "server" / SERVER_CERT).write_text("not a certificate")
    with pytest.raises(FscacheError, match="fscache certs"):
        server_context(tmp_path / "server")


async def test_two_clients_with_their_own_certificates_have_two_identities(
    certs: Bundles,
) -> None:
    with trio.fail_after(10):
        async with echo_server(certs.server) as server:
            for bundle in (certs.client, certs.of("bob")):
                stream = await trio.open_ssl_over_tcp_stream(
                    "127.0.0.1", server.port, ssl_context=client_context(bundle)
                )
                async with stream:
                    await stream.send_all(b"x")
                    assert await stream.receive_some() == b"x"
            assert server.identities == ["alice", "bob"]
    assert server.errors == []


def test_peer_identity_takes_the_common_name_else_an_alternative_name() -> None:
    assert peer_identity(None) is None
    assert peer_identity({}) is None
    cn = {"subject": ((("organizationName", "fscache"),), (("commonName", "alice"),))}
    assert peer_identity(cn) == "alice"
    assert peer_identity({"subject": (), "subjectAltName": (("DNS", "svc.example"),)}) == (
        "svc.example"
    )


async def test_a_client_bundle_cannot_act_as_the_server(certs: Bundles) -> None:
    with pytest.raises(FscacheError, match=SERVER_CERT):
        server_context(certs.client)  # it holds no server certificate or key
    # Even wired up by hand, its certificate is for client authentication only.
    impostor = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    impostor.load_cert_chain(certs.client / CLIENT_CERT, certs.client / CLIENT_KEY)
    victim = client_context(certs.of("bob"))
    victim.check_hostname = False  # so that only the certificate's purpose is judged
    with trio.fail_after(10):
        async with echo_server(certs.server, impostor) as server:
            client_error = await refused(server.port, victim)
            await server.done.wait()
    assert is_auth_failure(client_error)
    assert "certificate purpose" in repr(client_error.__cause__)


async def test_a_client_cannot_mint_a_certificate(tmp_path: pathlib.Path, certs: Bundles) -> None:
    # alice signs a certificate for "mallory" with her own key; the server refuses it.
    alice = x509.load_pem_x509_certificate((certs.client / CLIENT_CERT).read_bytes())
    alice_key = serialization.load_pem_private_key((certs.client / CLIENT_KEY).read_bytes(), None)
    assert isinstance(alice_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    mallory = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "mallory")]))
        .issuer_name(alice.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(alice_key, hashes.SHA256())
    )
    chain = tmp_path / "mallory.pem"
    chain.write_bytes(
        mallory.public_bytes(serialization.Encoding.PEM)
        + alice.public_bytes(serialization.Encoding.PEM)
    )
    key_file = tmp_path / "mallory-key.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ctx = ssl.create_default_context(cafile=str(certs.client / CA_CERT))
    ctx.load_cert_chain(chain, key_file)
    with trio.fail_after(10):
        async with echo_server(certs.server) as server:
            await refused(server.port, ctx)
            await server.done.wait()
    assert server.identities == []
    assert len(server.errors) == 1 and is_auth_failure(server.errors[0])


def test_the_readmes_names_are_reachable_from_a_bare_import_fscache() -> None:
    """``fscache.tls.client_context(...)`` and ``fscache.BadSetting`` work after only
    ``import fscache`` (a fresh interpreter: nothing imported fscache.tls before),
    and fscache.tls is loaded only when asked for."""
    script = (
        "import sys, fscache\n"
        "assert 'fscache.tls' not in sys.modules\n"
        "assert callable(fscache.tls.client_context) and callable(fscache.tls.make_certs)\n"
        "assert issubclass(fscache.BadSetting, (fscache.FscacheError, ValueError))\n"
        "assert issubclass(fscache.CredentialsRefused, fscache.Unauthorized)\n"
        "assert set(fscache.__all__) <= set(dir(fscache)) | {'BlockingClient', 'BlockingLock',"
        " 'Change',"
        " 'Client', 'DirEntry', 'StatResult', 'connect', 'open_client', 'CredentialsRefused'}\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def test_a_server_refuses_a_client_certificate_as_its_own(tmp_path: pathlib.Path) -> None:
    """A client's bundle copied in as the server's: refused at start (exit 1), not by
    every client's handshake later."""
    make_certs(tmp_path / "tls", clients=["alice"])
    alice, wrong = tmp_path / "tls" / "clients" / "alice", tmp_path / "wrong"
    wrong.mkdir()
    for source, target in (("ca.pem", "ca.pem"), ("client.pem", "server.pem"),
                           ("client-key.pem", "server-key.pem")):  # fmt: skip
        (wrong / target).write_bytes((alice / source).read_bytes())
    with pytest.raises(FscacheError, match="is not a server certificate"):
        server_context(wrong)
    root = tmp_path / "root"
    root.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "fscache", "serve", "--root", str(root), "--port", "0",
         "--tls", str(wrong)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"fscache: {wrong / 'server.pem'} is not a server certificate"
        " (its extended key usage has no serverAuth; a client's?): pass the server bundle,"
        " CERTS/server, made by `fscache certs`"
    ]


# ---------------------------------------------------------------- whose refusal, said
async def test_a_server_certificate_we_refuse_is_said_to_be_refused_by_us(
    tmp_path: pathlib.Path, certs: Bundles, other_certs: Bundles
) -> None:
    """A client bundle from another CA, or a host the server's certificate does not
    name: it is we who refuse the server's certificate, and the message says so."""
    import fscache
    from fscache.server.service import ServerSettings, serve

    root, other_root = tmp_path / "root", tmp_path / "other_root"
    root.mkdir()
    other_root.mkdir()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            settings = ServerSettings(root=str(root), port=0, tls_dir=str(certs.server))
            server = await nursery.start(serve, settings)
            with pytest.raises(fscache.CredentialsRefused) as other_ca:
                async with fscache.open_client(
                    "127.0.0.1", server.port, ssl_context=client_context(other_certs.client)
                ):
                    pass
            message = str(other_ca.value)
            assert message.startswith(f"TLS with 127.0.0.1:{server.port} failed: we refused")
            assert "the server's certificate (" in message and "CA did not sign it" in message

            hosts_only = tmp_path / "hosts"  # a server certificate for 127.0.0.1 alone
            make_certs(hosts_only, hosts=["127.0.0.1"], clients=["c"])
            named = ServerSettings(root=str(other_root), port=0, tls_dir=str(hosts_only / "server"))
            named_server = await nursery.start(serve, named)
            with pytest.raises(fscache.CredentialsRefused) as mismatch:
                async with fscache.open_client(
                    "localhost", named_server.port,
                    ssl_context=client_context(hosts_only / "clients" / "c"),
                ):  # fmt: skip
                    pass
            assert "we refused the server's certificate" in str(mismatch.value)
            assert "does not name the host we connected to" in str(mismatch.value)
            nursery.cancel_scope.cancel()


async def test_a_client_certificate_the_server_refuses_is_said_to_be_refused_by_it(
    certs: Bundles, other_certs: Bundles
) -> None:
    """A server that says why (its alert, as a stdlib server sends one in TLS 1.2):
    the message says it was the server that refused our certificate."""
    import fscache

    ctx = client_context(certs.client)
    ctx.load_cert_chain(other_certs.client / CLIENT_CERT, other_certs.client / CLIENT_KEY)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2  # the refusal comes in the handshake

    def serve_one(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        with conn, contextlib.suppress(ssl.SSLError, OSError):
            server_context(certs.server).wrap_socket(conn, server_side=True).recv(1)

    with trio.fail_after(30), socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)
        port = listener.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.to_thread.run_sync, serve_one, listener)
            with pytest.raises(fscache.CredentialsRefused) as refused_ours:
                async with fscache.open_client("127.0.0.1", port, ssl_context=ctx):
                    pass
    message = str(refused_ours.value)
    assert message.startswith(f"TLS with 127.0.0.1:{port} failed: the server refused our")
    assert "we refused" not in message


# ---------------------------------------------------------------- --tls DIR: usage
def fscache_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fscache", *args], capture_output=True, text=True, timeout=60
    )


def test_a_tls_directory_that_is_no_bundle_is_bad_usage(
    tmp_path: pathlib.Path, certs: Bundles
) -> None:
    """No such directory, the certs directory itself, or the other role's bundle: the
    argument names no bundle, which is bad usage (2), said before anything starts."""
    root = tmp_path / "root"
    root.mkdir()
    for command, bundle, words in [
        (["ls", "127.0.0.1:1"], tmp_path / "nowhere", "does not exist; make bundles with"),
        (["read", "127.0.0.1:1", "f"], certs.root, "holds every bundle: pass"),
        (["ls", "127.0.0.1:1"], certs.server, "is the server's bundle: a client passes"),
        (["serve", "--root", str(root), "--port", "0"], certs.client,
         "is a client's bundle: the server passes its own"),
        (["serve", "--root", str(root), "--port", "0"], tmp_path / "nowhere", "does not exist"),
    ]:  # fmt: skip
        done = fscache_cli(*command, "--tls", str(bundle))
        last = done.stderr.splitlines()[-1]
        assert done.returncode == 2, done.stderr
        assert last.startswith(f"fscache {command[0]}: error: argument --tls: "), last
        assert words in last, last


def test_a_tls_bundle_with_a_bad_file_is_an_error_not_bad_usage(
    tmp_path: pathlib.Path,
) -> None:
    make_certs(tmp_path / "tls", clients=["a"])
    bundle = tmp_path / "tls" / "clients" / "a"
    (bundle / CLIENT_CERT).write_text("not a certificate")
    done = fscache_cli("ls", "127.0.0.1:1", "--tls", str(bundle))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"fscache: bad TLS material in {bundle}")
