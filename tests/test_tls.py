"""Mutual TLS: certificate generation and real handshakes over TCP (``docs/design.md``,
"Public API", integrations).

Test rules: real sockets, because TLS is the point; 127.0.0.1 only, every listener
on port 0; no sleeps; every handshake runs under a ``trio.fail_after`` of several
seconds, a guard against a hang, never a timing assertion.
"""

from __future__ import annotations

import pathlib
import socket
import ssl
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from cryptography import x509

from fscache.errors import FscacheError
from fscache.tls import (
    ALL_FILES,
    CA_CERT,
    CLIENT_CERT,
    CLIENT_KEY,
    SERVER_CERT,
    client_context,
    is_auth_failure,
    make_certs,
    server_context,
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("tls") / "certs"
    make_certs(directory)
    return directory


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("tls-other") / "certs"
    make_certs(directory)
    return directory


class Server:
    def __init__(self, port: int) -> None:
        self.port = port
        self.errors: list[BaseException] = []
        self.done = trio.Event()  # set after each connection is handled


@asynccontextmanager
async def echo_server(directory: pathlib.Path) -> AsyncIterator[Server]:
    """An mTLS echo server on 127.0.0.1; handshake/IO errors are recorded, not raised."""
    ctx = server_context(directory)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    server = Server(listeners[0].socket.getsockname()[1])

    async def handle(tcp: trio.SocketStream) -> None:
        stream = trio.SSLStream(tcp, ctx, server_side=True)
        try:
            async with stream:
                await stream.do_handshake()
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


def test_make_certs_writes_files_with_private_keys(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "new"
    paths = make_certs(directory)
    assert paths == [directory / name for name in ALL_FILES]
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for p in paths:
        if p.name.endswith("-key.pem"):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p

    ca = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    server = x509.load_pem_x509_certificate((directory / SERVER_CERT).read_bytes())
    client = x509.load_pem_x509_certificate((directory / CLIENT_CERT).read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    server.verify_directly_issued_by(ca)
    client.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    eku = x509.oid.ExtendedKeyUsageOID
    assert list(server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        eku.SERVER_AUTH
    ]
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        eku.CLIENT_AUTH
    ]


def test_make_certs_refuses_to_overwrite(tmp_path: pathlib.Path) -> None:
    make_certs(tmp_path)
    before = (tmp_path / CLIENT_KEY).read_bytes()
    with pytest.raises(FscacheError, match="overwrite"):
        make_certs(tmp_path)
    assert (tmp_path / CLIENT_KEY).read_bytes() == before

    (tmp_path / CLIENT_KEY).chmod(0o644)  # an old, too-wide mode is not kept
    make_certs(tmp_path, overwrite=True)
    assert (tmp_path / CLIENT_KEY).read_bytes() != before
    assert stat.S_IMODE((tmp_path / CLIENT_KEY).stat().st_mode) == 0o600


def test_make_certs_refuses_if_any_file_exists(tmp_path: pathlib.Path) -> None:
    (tmp_path / CA_CERT).write_bytes(b"mine")
    with pytest.raises(FscacheError, match=CA_CERT):
        make_certs(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [CA_CERT]


def test_contexts_settings(certs: pathlib.Path) -> None:
    server = server_context(certs)
    assert server.verify_mode == ssl.CERT_REQUIRED
    assert server.minimum_version >= ssl.TLSVersion.TLSv1_2
    client = client_context(certs)
    assert client.verify_mode == ssl.CERT_REQUIRED and client.check_hostname
    assert client.minimum_version >= ssl.TLSVersion.TLSv1_2


async def test_mutual_tls_round_trip(certs: pathlib.Path) -> None:
    with trio.fail_after(10):
        async with echo_server(certs) as server:
            stream = await trio.open_ssl_over_tcp_stream(
                "127.0.0.1", server.port, ssl_context=client_context(certs)
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
async def test_hostname_and_ip_sans_verify(certs: pathlib.Path, host: str) -> None:
    with trio.fail_after(10):
        async with echo_server(certs) as server:
            stream = await trio.open_ssl_over_tcp_stream(
                host, server.port, ssl_context=client_context(certs)
            )
            async with stream:
                await stream.do_handshake()
                await stream.send_all(b"x")
                assert await stream.receive_some() == b"x"


async def test_client_without_certificate_is_refused(certs: pathlib.Path) -> None:
    with trio.fail_after(10):
        async with echo_server(certs) as server:
            anonymous = ssl.create_default_context(cafile=str(certs / CA_CERT))
            client_error = await refused(server.port, anonymous)
            await server.done.wait()
            # The server refused: it knows why. (trio does not flush the TLS alert
            # before closing, so the client may only see an abrupt EOF.)
            assert len(server.errors) == 1
            assert is_auth_failure(server.errors[0]), repr(server.errors[0].__cause__)
            assert isinstance(client_error, trio.BrokenResourceError | ssl.SSLError)


async def test_client_from_another_ca_is_refused(
    certs: pathlib.Path, other_certs: pathlib.Path
) -> None:
    with trio.fail_after(10):
        async with echo_server(certs) as server:
            client_error = await refused(server.port, client_context(other_certs))
            await server.done.wait()
            # The client trusts only its own CA, so it refuses the server's certificate.
            assert is_auth_failure(client_error), repr(client_error.__cause__)
            assert len(server.errors) == 1


async def test_server_refuses_a_client_cert_from_another_ca(
    certs: pathlib.Path, other_certs: pathlib.Path
) -> None:
    # The client trusts the right CA but presents a certificate signed by another one.
    ctx = ssl.create_default_context(cafile=str(certs / CA_CERT))
    ctx.load_cert_chain(other_certs / CLIENT_CERT, other_certs / CLIENT_KEY)
    with trio.fail_after(10):
        async with echo_server(certs) as server:
            client_error = await refused(server.port, ctx)
            await server.done.wait()
            assert len(server.errors) == 1
            assert is_auth_failure(server.errors[0]), repr(server.errors[0].__cause__)
            assert isinstance(client_error, trio.BrokenResourceError | ssl.SSLError)


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
@pytest.mark.parametrize("client_cert", ["none", "other-ca"])
async def test_refusal_alert_from_a_stdlib_server_is_an_auth_failure(
    certs: pathlib.Path, other_certs: pathlib.Path, version: ssl.TLSVersion, client_cert: str
) -> None:
    # Unlike trio, a blocking stdlib server sends its alert, so the client learns why.
    ctx = ssl.create_default_context(cafile=str(certs / CA_CERT))
    ctx.maximum_version = version
    if client_cert == "other-ca":
        ctx.load_cert_chain(other_certs / CLIENT_CERT, other_certs / CLIENT_KEY)
    server_errors: list[BaseException] = []

    def serve_one(listener: socket.socket) -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        with conn:
            try:
                with server_context(certs).wrap_socket(conn, server_side=True) as tls:
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
    make_certs(tmp_path)
    (tmp_path / CLIENT_KEY).unlink()
    server_context(tmp_path)  # the server does not need the client key
    with pytest.raises(FscacheError, match=rf"{CLIENT_KEY}.*fscache certs"):
        client_context(tmp_path)


def test_corrupt_file_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    make_certs(tmp_path)
    (tmp_path / SERVER_CERT).write_text("not a certificate")
    with pytest.raises(FscacheError, match="fscache certs"):
        server_context(tmp_path)
