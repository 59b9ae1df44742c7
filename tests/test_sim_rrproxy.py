"""The replay's round-robin TCP proxy in front of webhook replicas (sim/rrproxy.py): each connection
goes to the next backend, bytes pass unchanged both ways, and only loopback addresses are taken."""

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


@pytest.mark.parametrize("text", ["10.0.0.1:443", "0.0.0.0:80", "127.0.0.1:http", "127.0.0.1"])
def test_only_loopback_addresses_with_a_port_are_taken(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="loopback only"):
        rrproxy._address(text)
