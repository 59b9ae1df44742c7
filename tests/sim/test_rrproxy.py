"""The replay's round-robin TCP proxy in front of webhook replicas (sim/rrproxy.py): each connection
goes to the next backend, bytes pass unchanged both ways, a backend that is gone is passed over for
the next (the client is closed only when none answers), and only loopback addresses are taken."""

from __future__ import annotations

import argparse
import asyncio
import socket

import pytest

from gpuslice.sim import rrproxy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def backend(name: bytes) -> tuple[asyncio.Server, int]:
    """A server that answers each line with its name and the line."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            writer.write(name + b":" + line)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=1 << 20)
    return server, server.sockets[0].getsockname()[1]


async def test_connections_go_to_the_backends_in_turn_and_bytes_pass_unchanged() -> None:
    (first, first_port), (second, second_port) = await backend(b"a"), await backend(b"b")
    port = free_port()
    started = asyncio.Event()
    proxy = asyncio.create_task(
        rrproxy.serve(("127.0.0.1", port), [("127.0.0.1", first_port), ("127.0.0.1", second_port)], started)
    )
    try:
        await asyncio.wait_for(started.wait(), 10)
        answers = []
        for i in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
            payload = b"x" * 100_000 + f"{i}\n".encode()  # more than one read's worth
            writer.write(payload)
            await writer.drain()
            answers.append(await asyncio.wait_for(reader.readline(), 10))
            writer.close()
        assert [a[:2] for a in answers] == [b"a:", b"b:", b"a:", b"b:"]
        assert all(a[2:] == b"x" * 100_000 + f"{i}\n".encode() for i, a in enumerate(answers))
    finally:
        proxy.cancel()
        for server in (first, second):
            server.close()


def dead_port() -> int:
    """A loopback port nothing listens on: connecting is refused."""
    return free_port()


async def proxied(ports: list[int]) -> tuple[asyncio.Task[None], int]:
    """The proxy in front of `ports`, serving; (its task, its port)."""
    port = free_port()
    started = asyncio.Event()
    task = asyncio.create_task(rrproxy.serve(("127.0.0.1", port), [("127.0.0.1", p) for p in ports], started))
    await asyncio.wait_for(started.wait(), 10)
    return task, port


async def ask(port: int, line: bytes = b"hello\n") -> bytes:
    """One connection through the proxy: the answer to one line (b"" when the proxy closes it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(line)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()


async def test_a_backend_that_refuses_is_passed_over_for_the_next_in_turn() -> None:
    (first, first_port), (third, third_port) = await backend(b"a"), await backend(b"c")
    proxy, port = await proxied([first_port, dead_port(), third_port])
    try:
        # The dead one's turn goes to the backend after it; the rotation itself is unchanged.
        assert [(await ask(port))[:2] for _ in range(6)] == [b"a:", b"c:", b"c:", b"a:", b"c:", b"c:"]
    finally:
        proxy.cancel()
        for server in (first, third):
            server.close()


async def test_a_backend_that_dies_between_connections_gets_no_more_of_them() -> None:
    (first, first_port), (second, second_port) = await backend(b"a"), await backend(b"b")
    proxy, port = await proxied([first_port, second_port])
    try:
        assert [(await ask(port))[:2] for _ in range(2)] == [b"a:", b"b:"]
        second.close()  # its process killed: the port now refuses
        await second.wait_closed()
        assert [(await ask(port))[:2] for _ in range(4)] == [b"a:"] * 4
    finally:
        proxy.cancel()
        first.close()


async def test_a_client_is_closed_when_no_backend_answers() -> None:
    proxy, port = await proxied([dead_port(), dead_port()])
    try:
        assert await ask(port) == b""
    finally:
        proxy.cancel()


@pytest.mark.parametrize("text", ["10.0.0.1:443", "0.0.0.0:80", "127.0.0.1:http", "127.0.0.1"])
def test_only_loopback_addresses_with_a_port_are_taken(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="loopback only"):
        rrproxy._address(text)
