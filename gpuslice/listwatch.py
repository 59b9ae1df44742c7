"""List + watch one kind of Kubernetes object, the way informers do: list in pages, then watch
from the list's resourceVersion; on 410 Gone list again; on any other error keep the last view and
list again after a backoff (gpuslice.backoff: doubling, capped, cut short by `stop()`). The
webhook's node view and the device plugin's pods of its node are both kept this way.

The official client blocks, so its calls run in a thread; responses are read raw and parsed as
JSON (building client model objects for thousands of nodes would cost more than what is read), and
events are handed to the subclass on the event loop, so its view is only touched from one thread.

Lists are paged (500 objects a page), never whole: a whole list of 60,000 pending pods is about a
gigabyte once parsed, and parsing it holds the interpreter's lock for tens of seconds, during which
the webhook answers nothing (docs/benchmarks.md, "Cluster scale"). A page is cut down to what the
subclass `keep`s and handed to it (`listed`) before the next one is read. The pages are
consistent reads, which the API server (1.34 and later) serves from its watch cache; a list at
resourceVersion "0" would be served from the cache too, but whole, whatever the limit.

A watch may instead read its list as a stream (`stream_lists`, for the cluster-wide pod watches):
a watch with `sendInitialEvents`, which the API server answers with every object as an ADDED event
and then a bookmark marked `k8s.io/initial-events-end` carrying the list's resourceVersion (the
WatchList feature: on by default in 1.32 and from 1.34, off in 1.33). One request instead of one
a page, no continue tokens, and the server streams from its watch cache without building pages:
at 100,000 pods the pacer is ready in about three quarters of the paged time, with 20-30 MiB less
at its peak (docs/benchmarks.md, "Cluster scale"). The events are handed on in batches of a page.
An API server that refuses such a watch (422 where the feature is off or unknown) or ends it
without the bookmark is read in pages from then on.

The compact pod watches ask for protobuf first (gpuslice.podwire): encoding 100,000 pods as JSON
is most of the API server's work in a list, on the cores the reader needs too, and protobuf takes
a quarter of that. An API server or proxy that cannot encode it answers JSON, and the response's
Content-Type says which came.

Subclasses take the loop's timing as `**options` (`Options`) and pass it on; `PodWatch` is the
pods a field selector picks out, cluster-wide, which most of them watch.

May import gpuslice.{backoff,compact,podwire,timeouts} and the kubernetes client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, TypedDict, Unpack

import kubernetes

from gpuslice import backoff, podwire, timeouts
from gpuslice import compact as compact_

__all__ = ["ListWatch", "Options", "PodWatch"]

log = logging.getLogger(__name__)

_LIST_PAGE = 500
_READ_CHUNK = 1 << 16  # bytes read from a protobuf watch stream at a time
_INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the annotation on the bookmark ending a streamed list


class Options(TypedDict, total=False):
    """The timing of a ListWatch (its constructor's defaults where left out), as subclasses pass it on."""

    watch_timeout_seconds: int
    request_timeout_seconds: float
    backoff_initial_seconds: float
    backoff_max_seconds: float


class _Gone(Exception):
    """The resourceVersion (or a list's continue token) is too old (HTTP 410): list again."""


class _NotStreamed(Exception):
    """The API server does not stream lists (it refused the watch, or sent no end bookmark)."""


class _Stopped(Exception):
    """`stop()` was called while a list was being read: its last pages are not read."""


class ListWatch:
    """`run()` until cancelled or `stop()`; `synced` is set after the first list. Subclasses give
    `replace` (the whole list) and `apply` (one watch event), and may give `keep`."""

    def __init__(
        self,
        list_call: Callable[[], Callable[..., Any]],
        what: str,
        *,
        field_selector: str | None = None,
        watch_timeout_seconds: int = 300,
        request_timeout_seconds: float = 30.0,
        backoff_initial_seconds: float = 0.5,
        backoff_max_seconds: float = 30.0,
        stream_lists: bool = False,
    ) -> None:
        # () -> the client's list function (e.g. CoreV1Api.list_node), looked up on each call so a
        # client can be made on first use.
        self._list_call = list_call
        self.what = what  # for log lines: "nodes", "pods of spec.nodeName=n1"
        self.field_selector = field_selector
        self.watch_timeout_seconds = watch_timeout_seconds
        self.request_timeout_seconds = request_timeout_seconds
        self.backoff_initial_seconds = backoff_initial_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.stream_lists = stream_lists  # set to False for good once the server does not stream
        self.synced = asyncio.Event()
        self.lists = 0  # full lists applied (lists again after 410 count too)
        self.watches = 0
        self.failures = 0  # lists or watches that failed (not counting 410 Gone)
        self._stopping = threading.Event()
        self._response: Any = None  # the open watch stream, shut down by stop()
        self._wakeup: asyncio.Event | None = None
        self._listing: list[Mapping[str, Any]] = []  # the pages `listed` kept of the list being read

    # --- what subclasses give ------------------------------------------------------------------
    def keep(self, obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """What of a listed or watched object is handed on (gpuslice.compact), or None to skip it.
        Runs in the reading thread. An object skipped is skipped in every event, so the test
        must be one an object the subclass holds cannot stop passing (an annotation set at
        admission, a phase it never leaves). Default: the whole object."""
        return obj

    def listed(self, page: Sequence[Mapping[str, Any]]) -> None:
        """One page of a list, on the event loop, as soon as it is read. By default it is kept
        until the list is whole and `replace` gets every page's objects at once; a subclass that can
        take a page at a time (so that no list is ever held whole) handles it here and keeps what
        it needs, and gets an empty list in `replace`."""
        self._listing.extend(page)

    def list_started(self) -> None:
        """A list begins, the first or again after one that failed part-way: a subclass that takes
        pages as they come (`listed`) forgets what it gathered of an unfinished list here, or a pod
        deleted between the two would outlive the list that no longer shows it."""

    def replace(self, items: Sequence[Mapping[str, Any]]) -> None:
        raise NotImplementedError

    def apply(self, kind: str, obj: Mapping[str, Any]) -> None:
        raise NotImplementedError

    # --- running -----------------------------------------------------------------------------
    @property
    def listing(self) -> bool:
        """The first list is still on its way (no list done, none failed, not stopped)."""
        return not self.synced.is_set() and not self.failures and not self._stopping.is_set()

    def stop(self) -> None:
        """Ask `run()` to return: interrupts a blocking watch read and a backoff wait."""
        self._stopping.set()
        if self._wakeup is not None:
            self._wakeup.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()
            except Exception:  # noqa: BLE001 - best effort: the read ends by its timeout otherwise
                log.debug("could not shut down the %s watch", self.what, exc_info=True)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        retry = backoff.Backoff(self.backoff_initial_seconds, self.backoff_max_seconds)
        try:
            while not self._stopping.is_set():
                try:
                    version = await self._list()
                    items, self._listing = self._listing, []
                    self.replace(items)
                    self.lists += 1
                    self.synced.set()
                    retry.reset()
                    while not self._stopping.is_set():
                        started = loop.time()
                        version = await asyncio.to_thread(self._watch, loop, version)
                        if loop.time() - started < 1.0:  # a server that ends watches at once is not hammered
                            await self._pause(self.backoff_initial_seconds)
                except _Gone:
                    log.info("watch of %s expired (410 Gone): listing again", self.what)
                except _Stopped:
                    break
                except Exception as exc:  # noqa: BLE001 - any API failure: keep the last view, retry
                    if self._stopping.is_set():
                        break
                    self.failures += 1
                    delay = retry.next()
                    log.warning("%s not watched, retrying in %.1f s: %s", self.what, delay, exc)
                    await self._pause(delay)
        finally:
            self.stop()  # a cancelled run must not leave a thread reading the stream

    async def _pause(self, seconds: float) -> None:
        assert self._wakeup is not None
        await timeouts.wait_at_most(self._wakeup.wait(), seconds)

    # --- in the thread -------------------------------------------------------------------------
    def _accept(self, watch: bool) -> str | None:
        """The Accept header of a list (`watch` False) or a watch; None: the client's (JSON)."""
        return None

    def _call(self, **kwargs: Any) -> Any:
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        if accept := self._accept(bool(kwargs.get("watch"))):
            kwargs["_headers"] = {"Accept": accept}
        try:
            return self._list_call()(_preload_content=False, **kwargs)
        except kubernetes.client.ApiException as exc:
            if exc.status == 410:
                raise _Gone() from None
            raise

    def _start_list(self) -> None:
        self._listing = []
        self.list_started()

    async def _list(self) -> str:
        """Read a list as a stream or page by page, each page handed to `listed` before the next
        is asked for; the list's resourceVersion."""
        self._start_list()
        if self.stream_lists:
            try:
                return await asyncio.to_thread(self._stream_list, asyncio.get_running_loop())
            except _NotStreamed as exc:
                log.info("%s: the API server does not stream lists (%s): reading them in pages", self.what, exc)
                self.stream_lists = False
                self._start_list()  # a subclass taking pages sees the list start again, as after a failure
        token: str | None = None
        while True:
            page, token, version = await asyncio.to_thread(self._page, token)
            if self._stopping.is_set():
                raise _Stopped()
            self.listed(page)
            if not token:
                return version

    def _page(self, token: str | None) -> tuple[list[Mapping[str, Any]], str | None, str]:
        """(what `keep` kept of one page, the next page's token, the list's resourceVersion)."""
        kwargs: dict[str, Any] = {"_request_timeout": self.request_timeout_seconds, "limit": _LIST_PAGE}
        if token:
            kwargs["_continue"] = token
        response = self._call(**kwargs)
        if podwire.is_protobuf(_content_type(response)):
            items, token, version = self._decode_list_protobuf(response.data)
        else:
            items, token, version = self._decode_list(response.data)
        return [k for obj in items if (k := self.keep(obj)) is not None], token, version

    def _stream_list(self, loop: asyncio.AbstractEventLoop) -> str:
        """Read a list as a watch's initial events, handing them to `listed` on the loop a page at a
        time; the resourceVersion of the bookmark that ends them."""
        try:
            response = self._call(
                watch=True,
                send_initial_events=True,
                resource_version_match="NotOlderThan",  # with no resourceVersion: a consistent read
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout_seconds,
                _request_timeout=(self.request_timeout_seconds, self.watch_timeout_seconds + 30),
            )
        except kubernetes.client.ApiException as exc:
            if exc.status in (400, 422):
                raise _NotStreamed(f"HTTP {exc.status}: {exc.reason}") from None
            raise
        self._response = response
        page: list[Mapping[str, Any]] = []
        try:
            for kind, obj in self._events(response):
                metadata = obj.get("metadata") or {}
                if kind == "BOOKMARK":
                    if (metadata.get("annotations") or {}).get(_INITIAL_EVENTS_END) == "true":
                        loop.call_soon_threadsafe(self.listed, page)
                        return str(metadata.get("resourceVersion") or "")
                elif kind == "ADDED" and (kept := self.keep(obj)) is not None:
                    page.append(kept)
                    if len(page) >= _LIST_PAGE:
                        loop.call_soon_threadsafe(self.listed, page)
                        page = []
                elif kind in ("MODIFIED", "DELETED"):
                    # Only a server that ignored sendInitialEvents sends changes before the bookmark.
                    raise _NotStreamed(f"a {kind} event before the initial events ended")
            if self._stopping.is_set():
                raise _Stopped()
            raise _NotStreamed("the watch ended without the bookmark that ends a streamed list")
        finally:
            self._response = None
            response.release_conn()

    def _decode_list(self, data: bytes) -> tuple[list[Mapping[str, Any]], str | None, str]:
        """(a list's objects, its continue token, its resourceVersion): whole objects."""
        body = json.loads(data)
        metadata = body.get("metadata") or {}
        return body.get("items") or [], metadata.get("continue") or None, str(metadata.get("resourceVersion", ""))

    def _decode_event(self, line: bytes) -> tuple[str, Mapping[str, Any]]:
        """(a watch event's type, its object): the object whole."""
        event = json.loads(line)
        return str(event.get("type") or ""), event.get("object") or {}

    def _decode_list_protobuf(self, data: bytes) -> tuple[list[Mapping[str, Any]], str | None, str]:
        """A list the server sent in protobuf, where `_accept` asked for it (subclasses that do)."""
        raise ValueError(f"{self.what}: a protobuf list, which this watch did not ask for")

    def _decode_frame(self, frame: bytes) -> tuple[str, Mapping[str, Any]]:
        """A protobuf watch event, where `_accept` asked for them (subclasses that do)."""
        raise ValueError(f"{self.what}: a protobuf watch event, which this watch did not ask for")

    def _events(self, response: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """A watch stream's events, (type, object), until it ends or `stop()` is called; an ERROR
        event raises (410 Gone: `_Gone`, so the caller lists again). JSON lines, or protobuf
        frames where the server sent those."""
        if self._stopping.is_set():  # stopped before the stream was there to shut down
            return
        if podwire.is_protobuf(_content_type(response)):
            raw: Generator[bytes] = podwire.frames(response.stream(_READ_CHUNK))
            decode: Callable[[bytes], tuple[str, Mapping[str, Any]]] = self._decode_frame
        else:
            raw = (line for line in response if line.strip())
            decode = self._decode_event
        try:
            for item in raw:
                if self._stopping.is_set():
                    return
                kind, obj = decode(item)
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                yield kind, obj
        finally:
            # Closed now, not when the exception that ends the watch lets go of this frame: the
            # stream's reader then closes its connection, which is never handed back half read.
            raw.close()

    def _watch(self, loop: asyncio.AbstractEventLoop, version: str) -> str:
        """Stream events from `version` until the server ends the watch; returns the last version."""
        response = self._call(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_seconds,
            _request_timeout=(self.request_timeout_seconds, self.watch_timeout_seconds + 30),
        )
        self._response = response
        self.watches += 1
        try:
            for kind, obj in self._events(response):
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED") and (kept := self.keep(obj)) is not None:
                    loop.call_soon_threadsafe(self.apply, kind, kept)
            return version
        finally:
            self._response = None
            response.release_conn()


def _content_type(response: Any) -> str | None:
    headers = getattr(response, "headers", None)
    return headers.get("Content-Type") if headers is not None else None


class PodWatch(ListWatch):
    """The pods `field_selector` picks out, of every namespace. Subclasses give `replace` and
    `apply`, and may give `keep` (gpuslice.compact.pod keeps what gpuslice reads). `compact`: pages
    and events are decoded with only the keys gpuslice.compact.pod may keep (typed, skipping the
    rest of each pod's JSON, about four times faster than parsing it whole), or, asked for first,
    read from protobuf into the same shape (gpuslice.podwire); `keep` then gets those, not whole
    pods. `stream_lists`: lists are read as a watch's initial events (ListWatch)."""

    def __init__(
        self,
        core_api: Callable[[], Any],
        what: str,
        field_selector: str,
        *,
        compact: bool = False,
        stream_lists: bool = False,
        **options: Unpack[Options],
    ) -> None:
        # core_api() -> the CoreV1Api, looked up on each call so a client can be made on first use.
        super().__init__(
            lambda: core_api().list_pod_for_all_namespaces,
            what,
            field_selector=field_selector,
            stream_lists=stream_lists,
            **options,
        )
        self.compact = compact
        self.protobuf = compact  # ask for protobuf (compact pods only); False for good once not understood

    def _accept(self, watch: bool) -> str | None:
        # Protobuf, else JSON: the same pods for a quarter of the API server's CPU (gpuslice.podwire).
        if not self.protobuf:
            return None
        return podwire.ACCEPT_WATCH if watch else podwire.ACCEPT_LIST

    def _decode_list_protobuf(self, data: bytes) -> tuple[list[Mapping[str, Any]], str | None, str]:
        try:
            pods, token, version = podwire.pod_page(data)
        except ValueError as exc:
            self._no_protobuf(exc)
            raise
        return list(pods), token, version

    def _decode_frame(self, frame: bytes) -> tuple[str, Mapping[str, Any]]:
        try:
            return podwire.pod_event(frame)
        except ValueError as exc:
            self._no_protobuf(exc)
            raise

    def _no_protobuf(self, exc: ValueError) -> None:
        # The list or watch fails and is read again, as JSON from then on: nothing is skipped.
        log.warning("%s: protobuf not understood (%s): reading JSON from now on", self.what, exc)
        self.protobuf = False

    def _decode_list(self, data: bytes) -> tuple[list[Mapping[str, Any]], str | None, str]:
        if self.compact:
            try:
                pods, token, version = compact_.pod_page(data)
                return list(pods), token, version
            except ValueError as exc:  # a shape the typed decode does not know: read it whole
                log.warning("%s: a page read whole (%s)", self.what, exc)
        return super()._decode_list(data)

    def _decode_event(self, line: bytes) -> tuple[str, Mapping[str, Any]]:
        if self.compact:
            try:
                return compact_.pod_event(line)
            except ValueError as exc:
                log.warning("%s: an event read whole (%s)", self.what, exc)
        return super()._decode_event(line)
