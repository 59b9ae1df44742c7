"""The record of prepared claims (dra/checkpoint.py): replaced whole, never written in place. A
checkpoint that cannot be trusted stopping the plugin: tests/dra/test_preparer.py."""

from __future__ import annotations

import os

from dra_kit import dirs_fixture, uid  # noqa: F401 - fixture

from gpuslice import config
from gpuslice.dra import cdi, checkpoint


def test_the_checkpoint_is_replaced_whole_never_written_in_place(demo_node, dirs):
    state = checkpoint.Checkpoint(dirs["state"] / "checkpoint.json", "gpu.gpuslice.io")
    state.save()
    before = os.stat(state.path).st_ino
    state.put(
        checkpoint.PreparedClaim(
            uid(26), "ns", "n", checkpoint.STARTED, (), (), cdi.spec_file_name(config.Config().contract, uid(26))
        )
    )
    assert os.stat(state.path).st_ino != before
    assert [p.name for p in dirs["state"].iterdir()] == ["checkpoint.json"]
    assert checkpoint.Checkpoint(state.path, "gpu.gpuslice.io").load()[uid(26)].state == checkpoint.STARTED
