"""What the webhook decided for one pod (webhook/conversions.py): the one rounding rule for a share
of a GPU never gives shares that add up to one GPU more units than the GPU has."""

from __future__ import annotations

from gpuslice.webhook import conversions


def test_fractions_that_add_up_to_one_gpu_fit_on_it() -> None:
    per_gpu = 81559 // 256  # 318: 0.2 x 318 = 63.6
    for shares in ([0.2] * 5, [0.8, 0.2], [0.5, 0.5], [0.3, 0.3, 0.4], [0.46, 0.54]):
        assert sum(conversions.fraction_units(f, per_gpu) for f in shares) <= per_gpu, shares
