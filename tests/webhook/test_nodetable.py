"""The node table (webhook/nodetable.py), asked through the view as admissions ask it: its answers,
kept per version of the view, equal a count node by node; a demand kept to ask again (`FreeUnits`)
reads the promises on top each time."""

from __future__ import annotations

import random

import pytest
from clusterkit import CONTRACT, gpu_labels, view

from gpuslice.webhook import cluster


def test_usable_free_units_follow_every_change_though_answers_are_kept_per_version() -> None:
    """The view keeps its answers until a node changes (admissions repeat the same demands):
    after every update or removal a repeated query must see the new labels, as a fresh view does."""
    rng = random.Random(11)
    cv = view()
    current: dict[str, dict[str, str]] = {}
    demands = [
        ({24576: 10, 81920: 100, 143771: 200}, False, 0, 0),
        ({81920: 1, 143771: 1}, True, 8000, 65536),
        ({24576: 90, 81920: 300}, False, 16000, 0),
    ]
    for step in range(400):
        name = f"n{rng.randrange(12)}"
        if rng.random() < 0.2:
            cv.remove_node(name)
            current.pop(name, None)
        else:
            memory, gpus = rng.choice([(24576, 4), (81920, 8), (143771, 8)])
            units = memory // 256
            labels = gpu_labels(memory, gpus, "P", rng.randrange(0, gpus * units + 1))
            labels[CONTRACT.label_free_block_units] = str(rng.randrange(0, units + 1))
            labels[CONTRACT.label_free_gpus] = str(rng.randrange(0, gpus + 1))
            if rng.random() < 0.7:
                labels[CONTRACT.label_free_cpu_milli] = str(rng.randrange(0, 32000))
                labels[CONTRACT.label_free_memory_mib] = str(rng.randrange(0, 262144))
            cv.update_node(name, labels)
            current[name] = labels
        fresh = view()
        for fresh_name, labels in current.items():
            fresh.update_node(fresh_name, labels)
        for needs, whole, cpu, memory_mib in demands:
            asked = dict(needs=needs, whole_gpus=whole, cpu_milli=cpu, memory_request_mib=memory_mib)
            assert cv.usable_free_units(**asked) == fresh.usable_free_units(**asked), (step, asked)


def test_usable_free_units_equal_a_count_node_by_node() -> None:
    """The vector query (per GPU need, a classes x nodes matrix against the nodes where CPU and
    memory fit) sums what a plain loop over the nodes' labels sums, for any requests."""
    rng = random.Random(5)
    cv = view()
    nodes: list[dict[str, int]] = []
    for index in range(60):
        memory, gpus = rng.choice([(24576, 4), (81920, 8), (143771, 8)])
        units = memory // 256
        node = {
            "memory": memory,
            "units": (free := rng.randrange(0, gpus * units + 1)),
            "block": rng.randrange(0, min(units, free) + 1),
            "gpus": rng.randrange(0, free // units + 1),
            "cpu": rng.choice([-1, rng.randrange(0, 64000)]),
            "mem": rng.choice([-1, rng.randrange(0, 262144)]),
        }
        labels = gpu_labels(memory, gpus, "P", node["units"])
        labels[CONTRACT.label_free_block_units] = str(node["block"])
        labels[CONTRACT.label_free_gpus] = str(node["gpus"])
        for key, column in ((CONTRACT.label_free_cpu_milli, "cpu"), (CONTRACT.label_free_memory_mib, "mem")):
            if node[column] >= 0:
                labels[key] = str(node[column])
        cv.update_node(f"n{index}", labels)
        nodes.append(node)
    for _ in range(300):
        needs = {m: rng.randrange(0, 400) for m in rng.sample([24576, 81920, 143771, 40960], rng.randrange(1, 5))}
        whole = rng.random() < 0.3
        cpu, memory_mib = rng.choice([0, rng.randrange(1, 70000)]), rng.choice([0, rng.randrange(1, 300000)])
        expected = dict.fromkeys(needs, 0)
        for node in nodes:
            need = needs.get(node["memory"])
            if need is None or (node["gpus"] if whole else node["block"]) < max(1, need):
                continue
            if (node["cpu"] < 0 or node["cpu"] >= cpu) and (node["mem"] < 0 or node["mem"] >= memory_mib):
                expected[node["memory"]] += node["units"]
        asked = dict(needs=needs, whole_gpus=whole, cpu_milli=cpu, memory_request_mib=memory_mib)
        assert cv.usable_free_units(**asked) == expected, asked


def test_a_demand_kept_to_ask_again_answers_as_a_count_through_changes_promises_and_expiry() -> None:
    """The class choice of a remembered answer asks its `FreeUnits` again for every repeat; it
    looks the labelled figures up once per version of the view and reads the promises each time.
    Kept from the start through nodes coming, going and changing their headroom, promises of
    units and CPU, and promises expiring, it must answer what a count node by node and promise by
    promise gives (free units less the live promises, bounded by the CPU left where CPU is
    promised)."""
    rng = random.Random(17)
    now = [0.0]
    cv = cluster.ClusterView(CONTRACT, default_gpu_memory_mib=81920, clock=lambda: now[0])
    demands = [
        ({24576: 10, 81920: 100, 143771: 200}, False, 4000, 16384),
        ({24576: 90, 81920: 300}, False, 16000, 0),
        ({81920: 1, 143771: 1}, True, 8000, 65536),
        ({81920: 50, 143771: 50}, False, 0, 0),
    ]
    kept = [cv.free_units(needs, whole_gpus=w, cpu_milli=c, memory_request_mib=m) for needs, w, c, m in demands]
    nodes: dict[str, dict[str, int]] = {}
    promises: list[tuple[float, int, int, int]] = []  # (deadline, class memory, units, CPU millicores)
    for step in range(400):
        choice = rng.random()
        if choice < 0.25 or not nodes:  # a node joins (promises end only by expiry here: no label drops)
            memory, gpus = rng.choice([(24576, 4), (81920, 8), (143771, 8)])
            units = memory // 256
            free = rng.randrange(0, gpus * units + 1)
            node = {"memory": memory, "gpus": gpus, "units": free, "block": rng.randrange(0, min(units, free) + 1)}
            node |= {"free_gpus": rng.randrange(0, free // units + 1), "cpu": rng.choice([-1, rng.randrange(64000)])}
            node["mem"] = rng.choice([-1, rng.randrange(262144)])
            nodes[f"n{step}"] = node
        elif choice < 0.35:
            nodes.pop(rng.choice(sorted(nodes)))
        elif choice < 0.5:  # headroom moves, free units stay
            node = nodes[rng.choice(sorted(nodes))]
            node["cpu"], node["mem"] = rng.randrange(64000), rng.randrange(262144)
        elif choice < 0.85:
            memory, units = rng.choice([24576, 81920, 143771]), rng.randrange(1, 200)
            cpu = units * rng.choice([0, 10, 25])  # a whole number per unit: the sums stay exact
            cv.ledger.promise(memory, units, cpu_milli=cpu)
            promises.append((now[0] + cluster.PROMISE_SECONDS, memory, units, cpu))
        else:
            now[0] += rng.choice([1.0, 60.0, cluster.PROMISE_SECONDS / 2])
        for name in set(cv.node_names()) - set(nodes):
            cv.remove_node(name)
        for name, node in nodes.items():
            labels = gpu_labels(node["memory"], node["gpus"], "P", node["units"])
            labels[CONTRACT.label_free_block_units] = str(node["block"])
            labels[CONTRACT.label_free_gpus] = str(node["free_gpus"])
            for key, column in ((CONTRACT.label_free_cpu_milli, "cpu"), (CONTRACT.label_free_memory_mib, "mem")):
                if node[column] >= 0:
                    labels[key] = str(node[column])
            cv.update_node(name, labels)
        live = [p for p in promises if p[0] > now[0]]
        for (needs, whole, cpu, memory_mib), free_units in zip(demands, kept, strict=True):
            expected = {}
            for memory, need in needs.items():
                fits = [
                    n
                    for n in nodes.values()
                    if n["memory"] == memory
                    and (n["free_gpus"] if whole else n["block"]) >= max(1, need)
                    and (n["cpu"] < 0 or n["cpu"] >= cpu)
                    and (n["mem"] < 0 or n["mem"] >= memory_mib)
                ]
                left = max(0, sum(n["units"] for n in fits) - sum(p[2] for p in live if p[1] == memory))
                expected[memory] = left
            promised_cpu = {m: sum(p[3] for p in live if p[1] == m) for m in needs}
            if cpu > 0 and not whole and any(promised_cpu.values()):
                for memory, need in needs.items():
                    fits = [
                        n
                        for n in nodes.values()
                        if n["memory"] == memory
                        and n["block"] >= max(1, need)
                        and (n["cpu"] < 0 or n["cpu"] >= cpu)
                        and (n["mem"] < 0 or n["mem"] >= memory_mib)
                    ]
                    if promised_cpu[memory] > 0 and all(n["cpu"] >= 0 for n in fits):
                        room = sum(n["cpu"] for n in fits) - promised_cpu[memory]
                        expected[memory] = min(expected[memory], int(max(0, room) / cpu * max(1, need)))
            assert free_units.now() == expected, (step, needs)


def test_free_cpu_per_free_gpu_of_each_class_equals_a_count_node_by_node_less_the_promises() -> None:
    rng = random.Random(7)
    cv = view()
    sums: dict[int, list[int]] = {}  # memory -> [free CPU, free units, nodes without CPU headroom]
    for index in range(80):
        memory, gpus = rng.choice([(24576, 4), (81920, 8), (143771, 8)])
        free = rng.randrange(0, gpus * (memory // 256) + 1)
        cpu = -1 if rng.random() < 0.2 else rng.randrange(0, 96000, 1000)
        if memory == 81920 and cpu < 0:
            cpu = 0  # one class where every node publishes its CPU
        labels = gpu_labels(memory, gpus, "P", free)
        if cpu >= 0:
            labels[CONTRACT.label_free_cpu_milli] = str(cpu)
        cv.update_node(f"n{index}", labels)
        row = sums.setdefault(memory, [0, 0, 0])
        row[0], row[1], row[2] = row[0] + max(cpu, 0), row[1] + free, row[2] + (cpu < 0)
    for step in range(3):
        if step:
            cv.ledger.promise(81920, 40 * step, cpu_milli=12000 * step)
        ratios = cv.cpu_per_free_gpu()
        promised_units, promised_cpu = cv.ledger.outstanding()
        for memory, (cpu, units, hidden) in sums.items():
            gpus = (units - promised_units.get(memory, 0)) / (memory // 256)
            expected = None if hidden else (cpu - promised_cpu.get(memory, 0.0)) / gpus
            assert ratios[memory] == (pytest.approx(expected) if expected is not None else None), (memory, step)
    assert ratios[81920] is not None and ratios[24576] is None  # every node of one class publishes, not of another


def test_a_class_with_nothing_free_has_no_cpu_per_free_gpu() -> None:
    cv = view()
    labels = gpu_labels(81920, 8, "P", 0)
    labels[CONTRACT.label_free_cpu_milli] = "64000"
    cv.update_node("full", labels)
    assert cv.cpu_per_free_gpu() == {81920: 0.0}
