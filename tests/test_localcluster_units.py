"""Pure pieces of the local cluster: spec validation and node labels, selectors, patches, schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_gpu import constants as C
from airflow_gpu.localcluster.errors import ApiError
from airflow_gpu.localcluster.registry.patch import merge_patch, strategic_merge
from airflow_gpu.localcluster.registry.resources import Registry
from airflow_gpu.localcluster.registry.schema import decode_object
from airflow_gpu.localcluster.registry.selectors import labels_match, parse_field_selector, parse_label_selector
from airflow_gpu.localcluster.spec import SpecError, initial_nodes, load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_seed_example_nodes():
    spec = load_spec(EXAMPLES / "cluster-seed.yaml")
    nodes = {n["metadata"]["name"]: n for n in initial_nodes(spec)}
    assert len(nodes) == 14
    assert nodes["h100-od-1"]["metadata"]["labels"][C.NODE_CAPACITY_TYPE_KARPENTER] == "on-demand"
    assert nodes["h100-od-1"]["metadata"]["labels"][C.NODE_GPU_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    od, spot, mig = nodes["a100-od-0"], nodes["a100-spot-3"], nodes["a100-mig-0"]
    h100 = nodes["h100-spot-0"]
    assert h100["metadata"]["labels"][C.NODE_CAPACITY_TYPE_KARPENTER] == "spot"
    assert h100["metadata"]["labels"][C.NODE_GPU_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    assert h100["status"]["capacity"][C.RESOURCE_GPU] == "8" and h100["spec"]["taints"] == spot["spec"]["taints"]
    assert od["status"]["capacity"][C.RESOURCE_GPU] == "8"
    assert od["metadata"]["labels"][C.NODE_GPU_MEMORY] == "81920"
    assert od["metadata"]["labels"][C.NODE_MIG_STRATEGY] == "none"
    assert [n["metadata"]["labels"][C.NODE_GPU_CLIQUE] for k, n in sorted(nodes.items()) if k.startswith("a100-od")] == \
        ["clique-a1", "clique-a1", "clique-a2", "clique-a2"]
    assert spot["metadata"]["labels"][C.NODE_CAPACITY_TYPE_KARPENTER] == "spot"
    assert spot["spec"]["taints"] == [{"key": C.TAINT_SPOT, "value": "true", "effect": "NoSchedule"}]
    assert "taints" not in od["spec"]
    assert mig["metadata"]["labels"][C.NODE_MIG_STRATEGY] == "mixed"
    assert mig["status"]["allocatable"][C.RESOURCE_GPU] == "4"
    assert mig["status"]["allocatable"][C.RESOURCE_MIG_PREFIX + "1g.10gb"] == "28"
    mixed = nodes["a100-mig-mixed-0"]["status"]["allocatable"]
    assert (mixed[C.RESOURCE_GPU], mixed[C.RESOURCE_MIG_PREFIX + "3g.40gb"], mixed[C.RESOURCE_MIG_PREFIX + "1g.10gb"]) == ("6", "2", "4")


def test_eks_and_gke_capacity_labels():
    for provider, key, value in (("eks", C.NODE_CAPACITY_TYPE_EKS, "SPOT"), ("gke", C.NODE_GKE_SPOT, "true")):
        spec = parse_spec({"provider": provider, "pools": [{"name": "s", "count": 1, "capacityType": "spot"}]})
        assert initial_nodes(spec)[0]["metadata"]["labels"][key] == value


@pytest.mark.parametrize("pools, message", [
    ([{"name": "a", "count": 1, "gpu": {"count": 8, "mig": {"gpus": 1, "devices": [{"profile": "3g.40gb", "count": 3}]}}}],
     "compute slices"),
    ([{"name": "a", "count": 1, "gpu": {"count": 8, "mig": {"gpus": 1, "devices": [
        {"profile": "3g.40gb", "count": 2}, {"profile": "1g.10gb", "count": 1}]}}}], "memoryMiB"),
    ([{"name": "a", "count": 1, "gpu": {"count": 1, "mig": {"gpus": 2, "devices": [{"profile": "1g.10gb", "count": 1}]}}}],
     "mig.gpus=2 is more than gpu.count=1"),
    ([{"name": "a", "count": 1, "gpu": {"mig": {"gpus": 1, "devices": [{"profile": "big", "count": 1}]}}}], "1g.10gb"),
    ([{"name": "A_b", "count": 1}], "pools.0.name"),
    ([{"name": "a", "count": 1, "memory": "lots"}], "not a Kubernetes quantity"),
    ([{"name": "a", "count": 1}, {"name": "a", "count": 2}], "repeated: a"),
    ([{"name": "a", "count": 1, "colour": "red"}], "pools.0.colour"),
])
def test_bad_specs_name_the_field(pools, message):
    with pytest.raises(SpecError) as err:
        parse_spec({"pools": pools})
    assert message in str(err.value)


def test_label_selectors():
    reqs = parse_label_selector("team in (a, b),tier!=x,!legacy,gpu")
    assert labels_match(reqs, {"team": "a", "tier": "y", "gpu": "1"})
    assert not labels_match(reqs, {"team": "c", "gpu": "1"})
    assert not labels_match(reqs, {"team": "a", "gpu": "1", "legacy": "1"})
    assert not labels_match(reqs, {"team": "a", "tier": "x", "gpu": "1"})
    with pytest.raises(ApiError) as err:
        parse_label_selector("team in a")
    assert err.value.code == 400


def test_field_selectors_allowed_per_kind():
    assert parse_field_selector("spec.nodeName=n1,status.phase!=Failed", "Pod") == (
        ("spec.nodeName", False, "n1"), ("status.phase", True, "Failed"))
    with pytest.raises(ApiError) as err:
        parse_field_selector("spec.nodeName=n1", "ConfigMap")
    assert "field label not supported: spec.nodeName" in err.value.message


def test_strategic_merge_by_keys_and_directives():
    pod = {"spec": {"containers": [{"name": "a", "image": "1", "env": [{"name": "X", "value": "1"}]},
                                   {"name": "b", "image": "2"}],
                    "tolerations": [{"key": "t1"}]},
           "metadata": {"finalizers": ["f1"]}}
    patch = {"spec": {"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
                      "containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]}, {"name": "b", "$patch": "delete"}],
                      "tolerations": [{"key": "t2"}]},
             "metadata": {"finalizers": ["f2"]}}
    out = strategic_merge(pod, patch)
    assert out["spec"]["containers"] == [{"name": "a", "image": "1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]}]
    assert out["spec"]["tolerations"] == [{"key": "t2"}]  # atomic list: replaced
    assert out["metadata"]["finalizers"] == ["f1", "f2"]
    assert merge_patch({"a": {"b": 1, "c": 2}}, {"a": {"b": None, "d": 3}}) == {"a": {"c": 2, "d": 3}}


def test_decode_normalises_quantities_and_reports_unknown_fields():
    pods = Registry().by_key("/pods")
    obj, warnings = decode_object(pods, "v1", {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1, "cpu": 0.5}}, "extra": True}]}}, "Warn")
    assert obj["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1", "cpu": "0.5"}
    assert "extra" not in obj["spec"]["containers"][0] and warnings == ['unknown field "spec.containers[0].extra"']
    with pytest.raises(ApiError) as err:
        decode_object(pods, "v1", {"metadata": {"name": "p"}, "spec": {"containers": "no"}}, "Warn")
    assert err.value.code == 400 and "spec.containers" in err.value.message


def test_custom_resources_are_validated_against_their_crd_schema():
    import yaml

    from airflow_gpu.localcluster.admission import admission
    from airflow_gpu.localcluster.registry.resources import from_crd

    crd = Path(__file__).resolve().parents[1] / "airflow_gpu" / "localcluster" / "crds" / "scheduling.x-k8s.io_podgroups.yaml"
    rt = from_crd(yaml.safe_load(crd.read_text()))

    def check(spec):
        admission.validate(rt, {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                                "metadata": {"name": "g"}, "spec": spec}, True)
    check({"minMember": 4, "minResources": {"nvidia.com/gpu": "8"}})
    with pytest.raises(ApiError) as err:
        check({"minMember": "4"})
    assert err.value.code == 422 and err.value.message == (
        'PodGroup.scheduling.x-k8s.io "g" is invalid: spec.minMember: Invalid value: "string": '
        'spec.minMember in body must be of type integer: "string"')
    assert err.value.details["causes"][0]["field"] == "spec.minMember"


def test_store_log_compacts_and_reloads(tmp_path):
    from airflow_gpu.localcluster.registry.store import Store

    store = Store(tmp_path, history_size=100, compact_bytes=20_000)
    for i in range(300):
        store.create("/configmaps", {"metadata": {"name": f"c{i % 30}-{i // 30}", "namespace": "n"}, "data": {"i": "x" * 50}})
        if i % 3 == 0:
            store.delete("/configmaps", "n", f"c{i % 30}-{i // 30}")
        store.flush()
    size = (tmp_path / "store.log").stat().st_size
    assert size < 60_000  # compacted at least once (300 creates + 100 deletes would be ~60 kB)
    live = {(e.obj["metadata"]["name"], e.obj["metadata"]["resourceVersion"]) for e in store.entries("/configmaps")}
    rv = store.rv
    store.close()
    again = Store(tmp_path, history_size=100, compact_bytes=20_000)
    assert again.load()
    assert {(e.obj["metadata"]["name"], e.obj["metadata"]["resourceVersion"]) for e in again.entries("/configmaps")} == live
    assert again.rv == rv and len(live) == 200


def test_pods_share_the_injected_volume_and_intern_strings(tmp_path):
    """Every pod's kube-api-access volume is one read-only object in memory and repeated strings are
    interned, whatever path the pod took into the store (create, patch, a replayed log); the JSON served
    is the same as for plain copies, and the shared value cannot be changed through one pod."""
    from airflow_gpu.localcluster.admission.admission import share_pod_values
    from airflow_gpu.localcluster.registry.objects import ObjectAPI, deep_copy
    from airflow_gpu.localcluster.admission.serviceaccounts import INJECTED_PROJECTED, namespace_created
    from airflow_gpu.localcluster.registry.store import Store, decode, encode

    def build():
        store = Store(tmp_path, share={"/pods": share_pod_values})
        return store, ObjectAPI(store, Registry())

    store, objects = build()
    store.load()
    registry = objects.registry
    objects.create(registry.by_key("/namespaces"), {"metadata": {"name": "n"}})
    namespace_created(objects, "n", "CA")
    body = b'{"metadata": {"name": "%s", "labels": {"team": "vision-research"}}, "spec": {"containers": ' \
           b'[{"name": "main", "image": "ghcr.io/example/trainer:1.0"}]}}'
    for name in ("a", "b"):
        objects.create(registry.by_key("/pods"), decode(body % name.encode()), "n")
    a, b = store.get("/pods", "n", "a"), store.get("/pods", "n", "b")
    assert a["spec"]["volumes"][0]["projected"] is b["spec"]["volumes"][0]["projected"] is INJECTED_PROJECTED
    assert a["spec"]["containers"][0]["image"] is b["spec"]["containers"][0]["image"]
    assert a["metadata"]["labels"]["team"] is b["metadata"]["labels"]["team"]
    assert decode(encode(a)) == deep_copy(a) and encode(a).count(b'"serviceAccountToken"') == 1
    with pytest.raises(TypeError, match="read-only"):
        a["spec"]["volumes"][0]["projected"]["defaultMode"] = 0o600
    with pytest.raises(TypeError, match="read-only"):
        a["spec"]["volumes"][0]["projected"]["sources"].append({})
    copied = deep_copy(a)["spec"]["volumes"][0]["projected"]
    copied["defaultMode"] = 0o600  # a copy is plain and writable; the shared value is unchanged
    assert type(copied) is dict and INJECTED_PROJECTED["defaultMode"] == 0o644
    objects.patch(registry.by_key("/pods"), "n", "a", {"metadata": {"labels": {"team": "vision-research", "x": "1"}}},
                  "application/merge-patch+json")
    patched = store.get("/pods", "n", "a")
    assert patched["spec"]["volumes"][0]["projected"] is INJECTED_PROJECTED
    assert patched["metadata"]["labels"]["team"] is b["metadata"]["labels"]["team"]
    store.flush()
    store.close()
    again, _ = build()
    assert again.load()
    replayed = again.get("/pods", "n", "b")
    assert replayed["spec"]["volumes"][0]["projected"] is INJECTED_PROJECTED and replayed == b
