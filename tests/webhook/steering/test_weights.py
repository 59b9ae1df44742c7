"""The table of preferred-term weights (webhook/steering/weights.py): the grades that must not
overlap keep their order, and every weight is one kube-scheduler accepts."""

from __future__ import annotations

import dataclasses

from gpuslice.webhook import steering

# The nearly-full grades: less than a quarter, a half, the whole of steering.cpuPodsNearlyFullMiB free.
QUARTER, HALF, WHOLE = steering.WEIGHTS.cpu_pod_nearly_full


def test_weight_grades_keep_their_order_whatever_the_placement_score():
    w = steering.WEIGHTS
    fit_grades = [w.tight_fit, w.close_fit, w.loose_fit, w.one_free_gpu, w.few_free_gpus]
    assert fit_grades == sorted(fit_grades, reverse=True)
    smallest_step = min(a - b for a, b in zip(fit_grades, fit_grades[1:], strict=False))
    assert w.score_high < smallest_step and w.score_mid < w.score_high
    weights = [getattr(w, f.name) for f in dataclasses.fields(w)]
    assert all(1 <= weight <= 100 for value in weights for weight in (value if isinstance(value, tuple) else [value]))


def test_cpu_pod_grades_keep_cpu_nodes_first_and_free_whole_gpus_last():
    w = steering.WEIGHTS
    assert w.cpu_pod_cpu_node > QUARTER > HALF > WHOLE > w.cpu_pod_no_free_gpu > 0
