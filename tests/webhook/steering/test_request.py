"""What the steering families read of a converted pod (webhook/steering/request.py): the pod's CPU
and memory requests are not part of the request's identity, so requests that differ only in them
share the terms built once per request (webhook/steering/__init__.py)."""

from __future__ import annotations

import dataclasses

from gpuslice.webhook.steering import request


def test_the_identity_is_every_field_but_the_pods_cpu_and_memory() -> None:
    fields = {f.name for f in dataclasses.fields(request.Request)}
    assert request.IDENTITY == fields - {"cpu_milli", "memory_mib"}


def test_requests_that_differ_only_in_cpu_or_memory_are_one_request() -> None:
    share = request.Request(units=40, units_per_gpu=160, cpu_milli=6000, memory_mib=1024)
    other = dataclasses.replace(share, cpu_milli=12000, memory_mib=65536)
    assert share == other and hash(share) == hash(other)
    assert share != dataclasses.replace(share, units=41)
    assert share != dataclasses.replace(share, cpu_per_gpu_milli=12000)  # the balance terms' setting is identity


def test_a_default_request_considers_no_cpu_or_memory() -> None:
    assert (request.Request().cpu_milli, request.Request().memory_mib) == (-1, -1)
