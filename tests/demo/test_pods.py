"""The pods `make demo` sends (demo/pods.py): KAI Scheduler's examples in KAI's own shape. What the
webhook and the node make of them: tests/demo/test_main.py."""

from __future__ import annotations

import yaml

from gpuslice.demo import pods as demo_pods


def test_the_kai_example_pods_are_in_kai_s_own_shape_without_the_placeholder() -> None:
    """KAI's validator refuses a GPU resource beside a share: its examples carry none."""
    examples = [p for p in yaml.safe_load_all(demo_pods.KAI_EXAMPLE_MANIFEST) if p]
    assert len(examples) >= 2
    for pod in examples:
        assert set(pod["metadata"]["annotations"]) & {"gpu-fraction", "gpu-memory"}
        assert "kai.scheduler/queue" in pod["metadata"]["labels"]
        assert pod["spec"]["schedulerName"] == "kai-scheduler"
        for container in pod["spec"]["containers"]:
            assert "resources" not in container, pod["metadata"]["name"]
    (placeholder,) = [p for p in yaml.safe_load_all(demo_pods.KAI_PLACEHOLDER_MANIFEST) if p]
    assert placeholder["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
