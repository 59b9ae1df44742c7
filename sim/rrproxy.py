"""A TCP proxy that hands each connection it accepts to the next of its backends in turn, relaying
bytes both ways unchanged (TLS passes through: the backends serve the certificate). The replay on
the real control plane puts it in front of N webhook replicas, as a Service's ClusterIP spreads
connections over its endpoints (`gpuslice-sim --scheduler kube --webhook-replicas N`). A backend
that refuses the connection (its process is gone) is passed over for the next, as a Service drops
the endpoint of a pod that has died; the client is closed only when no backend answers.

    python -m gpuslice.sim.rrproxy --listen 127.0.0.1:PORT --backend 127.0.0.1:P1 --backend 127.0.0.1:P2

Loopback only, like everything the replay starts. May import the standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
from collections.abc import Iterator, Sequence

__all__ = ["main", "serve"]

_CHUNK = 64 * 1024
# A dead backend on loopback refuses at once; this bounds one that neither accepts nor refuses.
_CONNECT_TIMEOUT = 2.0


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected 127.0.0.1:PORT (loopback only)")
    return host, int(port)


async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _connect(
    backends: Sequence[tuple[str, int]], first: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A connection to the first backend that answers, trying them in turn from `first`; None if none does."""
    for i in range(len(backends)):
        host, port = backends[(first + i) % len(backends)]
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, port), _CONNECT_TIMEOUT)
        except OSError:  # refused, or timed out (TimeoutError is an OSError)
            continue
    return None


async def serve(listen: tuple[str, int], backends: Sequence[tuple[str, int]], started: asyncio.Event) -> None:
    """Serve until cancelled; `started` is set once the port is bound."""
    turn: Iterator[int] = itertools.cycle(range(len(backends)))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await _connect(backends, next(turn))
        if upstream is None:
            writer.close()
            return
        upstream_reader, upstream_writer = upstream
        await asyncio.gather(_relay(reader, upstream_writer), _relay(upstream_reader, writer))

    server = await asyncio.start_server(handle, *listen, backlog=2048)
    async with server:
        started.set()
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--listen", type=_address, required=True, metavar="127.0.0.1:PORT")
    parser.add_argument("--backend", type=_address, action="append", required=True, metavar="127.0.0.1:PORT")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.listen, args.backend, asyncio.Event()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
