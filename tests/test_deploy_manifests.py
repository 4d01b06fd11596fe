"""deploy/kubernetes/: each overlay renders with `kubectl kustomize`, validates offline against the
Kubernetes schemas (kubernetes-validate, strict), and holds together: autoscaler, probes, drain,
volumes, images and settings agree with each other and with the server. No cluster runs here."""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "nvidia")
NAME = "qwen3-tts"
KEDA = ("keda.sh/v1alpha1", "ScaledObject")
PORT = 8100
PRESTOP_S = 10


@functools.lru_cache(maxsize=None)
def _kubectl_minor(kubectl: str) -> int:
    """kubectl's client minor version ("32+" -> 32)."""
    done = subprocess.run([kubectl, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl version failed:\n{done.stderr}"
    return int(re.match(r"\d+", json.loads(done.stdout)["clientVersion"]["minor"]).group())


def _kubectl() -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (1.21 or newer) is not installed; Debian 12's kubernetes-client, 1.20, is too old")
    if _kubectl_minor(kubectl) < 21:
        # the overlays name their base under resources and their patches under patches (path:),
        # which kustomize reads from v2.1 on; kubectl 1.20 (Debian bookworm's) embeds v2.0.3
        pytest.skip(f"kubectl 1.{_kubectl_minor(kubectl)} is too old for deploy/kubernetes: its kustomize "
                    "reads neither resources: folders nor patches: (kubectl 1.21 or newer does)")
    return kubectl


def render(folder: Path) -> list[dict]:
    """`kubectl kustomize folder`, parsed."""
    done = subprocess.run([_kubectl(), "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {folder} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {**{name: render(KUBE / "overlays" / name) for name in (*OVERLAYS, "wyoming")},
            "model-pull": render(KUBE / "model-pull")}


KUSTOMIZATIONS = sorted(p.parent.relative_to(KUBE).as_posix() for p in KUBE.rglob("kustomization.yaml"))


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_kustomize_renders_without_warnings(folder):
    """Every kustomization renders and writes nothing to stderr: no deprecated field (bases,
    patchesStrategicMerge, ...) that newer kustomize warns about, no other warning."""
    done = subprocess.run([_kubectl(), "kustomize", str(KUBE / folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize {folder} failed:\n{done.stderr}"
    assert done.stderr == "", f"kubectl kustomize {folder} warned:\n{done.stderr}"
    assert [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def one(docs: list[dict], kind: str, name: str = NAME) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def container(pod_spec: dict, name: str, init: bool = False) -> dict:
    found = [c for c in pod_spec.get("initContainers" if init else "containers", []) if c["name"] == name]
    assert len(found) == 1, name
    return found[0]


def env_of(c: dict) -> dict[str, object]:
    """Container env: name -> value, or the valueFrom object."""
    names = [e["name"] for e in c.get("env", [])]
    assert len(names) == len(set(names)), f"duplicate env entries in {c['name']}: {names}"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def quantity(text: str | int) -> float:
    """A Kubernetes quantity (CPU or bytes) as a number."""
    units = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    m = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text))
    assert m and m.group(2) in units, text
    return float(m.group(1)) * units[m.group(2)]


def serve_flags() -> set[str]:
    from qwen3_tts_gguf.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {flag for action in sub.choices["serve"]._actions for flag in action.option_strings}


def test_overlays_validate_against_the_kubernetes_schemas(rendered):
    import kubernetes_validate
    from kubernetes_validate.utils import all_versions, latest_version

    # the oldest and the newest schemas it ships (1.25 and 1.37 in kubernetes-validate 1.37.0)
    versions = sorted({all_versions()[0], latest_version()})
    kinds = set()
    for overlay, docs in rendered.items():
        for doc in docs:
            kinds.add(doc["kind"])
            if (doc["apiVersion"], doc["kind"]) == KEDA:
                continue  # a custom resource: the schemas do not know it (checked below)
            for version in versions:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except Exception as e:  # noqa: BLE001 - name the object in the failure
                    pytest.fail(f"{overlay}: {doc['kind']}/{doc['metadata']['name']} does not validate against "
                                f"Kubernetes {version}: {e}")
    assert {"Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget", "ScaledObject", "Job"} <= kinds
    # the validator is strict, not a no-op: an unknown field fails
    broken = one(rendered["cpu"], "Deployment")
    broken = {**broken, "spec": {**broken["spec"], "replicaz": 3}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, versions[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deployment_probes_drain_and_volumes(rendered, overlay):
    docs = rendered[overlay]
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    spec = pod["spec"]
    server = container(spec, "server")
    env = env_of(server)
    assert "replicas" not in deployment["spec"], "the autoscaler owns the replica count"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0

    # probes: liveness on /health, readiness on /ready, on the served port
    port = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert port == {"http": PORT} and env["QTTS_PORT"] == str(PORT) and env["QTTS_HOST"] == "0.0.0.0"
    for probe, path in (("livenessProbe", "/health"), ("readinessProbe", "/ready"), ("startupProbe", "/health")):
        assert server[probe]["httpGet"] == {"path": path, "port": "http"}, probe

    # shutdown: preStop pause, then the drain, all within the grace period
    hook = server["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[0] == "python" and f"time.sleep({PRESTOP_S})" in hook[-1]
    drain = float(env["QTTS_DRAIN_TIMEOUT_S"])
    assert spec["terminationGracePeriodSeconds"] >= PRESTOP_S + drain + 10

    # threads follow the CPU limit; Guaranteed QoS (requests == limits)
    assert env["QTTS_THREADS"] == {"resourceFieldRef": {"containerName": "server", "resource": "limits.cpu",
                                                        "divisor": "1"}}
    res = server["resources"]
    assert res["requests"] == res["limits"]
    assert quantity(res["limits"]["cpu"]) >= 1 and quantity(res["limits"]["memory"]) >= 3 * 2**30

    # models read-only from their claim; voice profiles read-write on the shared claim
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["models"].get("readOnly") is True and volumes["models"]["persistentVolumeClaim"]["readOnly"] is True
    assert not mounts["voices"].get("readOnly")
    assert env["QTTS_VOICES_DIR"] == mounts["voices"]["mountPath"]
    assert env["QTTS_MODEL_BASE"] == mounts["models"]["mountPath"]
    models = env["QTTS_MODEL"].split(",")
    assert models and all(Path(m).parent == Path(mounts["models"]["mountPath"]) for m in models)
    assert any("-Base-" in m for m in models), "cloned voices need a Base model"
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    for name in ("models", "voices"):
        claim = claims[volumes[name]["persistentVolumeClaim"]["claimName"]]
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], f"{name}: every replica, any node"

    # the init container waits for exactly the served models, on the same read-only mount
    wait = container(spec, "wait-for-models", init=True)
    assert env_of(wait)["QTTS_MODEL"] == env["QTTS_MODEL"] and wait["image"] == server["image"]
    assert wait["volumeMounts"] == [mounts["models"]]

    # every QTTS_ setting is a serve flag (--foo-bar <-> QTTS_FOO_BAR; QTTS_MODEL_BASE names the folder)
    flags = serve_flags()
    for key in env:
        if key.startswith("QTTS_") and key != "QTTS_MODEL_BASE":
            flag = "--" + key[5:].lower().replace("_", "-")
            assert flag in flags, f"{key}: `serve` has no {flag}"
    assert isinstance(env["QTTS_API_KEY"], dict) and env["QTTS_API_KEY"]["secretKeyRef"]["optional"] is True
    assert env["QTTS_REPLICA_ID"] == {"fieldRef": {"fieldPath": "metadata.name"}}  # resume tokens name the pod

    # Service and PodDisruptionBudget select these pods
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"] == [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]
    assert "sessionAffinity" not in service["spec"] or service["spec"]["sessionAffinity"] == "None"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1

    # images per node kind
    gpu = overlay == "nvidia"
    assert server["image"] == f"qwen3-tts-x:{'cuda' if gpu else 'cpu'}"
    assert ("nvidia.com/gpu" in res["limits"]) is gpu
    if gpu:
        assert res["limits"]["nvidia.com/gpu"] == "1" and env["QTTS_DEVICE"] == "cuda"
        assert int(env["QTTS_GPU_LAYERS"]) > 0
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    else:
        assert "QTTS_DEVICE" not in env and "QTTS_GPU_LAYERS" not in env


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_autoscaler_required_fields(rendered, overlay):
    """KEDA's ScaledObject (a custom resource the schema validator does not know): the CRD's required
    fields (spec.scaleTargetRef.name, spec.triggers[].type and .metadata, metadata values strings),
    the prometheus scaler's required metadata, and agreement with the Deployment and the server."""
    docs = rendered[overlay]
    scaled = one(docs, "ScaledObject")
    assert (scaled["apiVersion"], scaled["kind"]) == KEDA
    spec = scaled["spec"]
    assert set(spec) <= {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval",
                         "cooldownPeriod", "idleReplicaCount", "advanced", "fallback", "triggers"}
    target = spec["scaleTargetRef"]
    assert target["name"] == one(docs, "Deployment")["metadata"]["name"]
    assert target.get("kind", "Deployment") == "Deployment" and target.get("apiVersion", "apps/v1") == "apps/v1"
    assert 2 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], "at least 2: the PDB lets one go"
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    for direction in ("scaleUp", "scaleDown"):
        for policy in behavior[direction]["policies"]:
            assert policy["type"] in ("Pods", "Percent") and policy["value"] > 0 and 0 < policy["periodSeconds"] <= 1800
        assert 0 <= behavior[direction]["stabilizationWindowSeconds"] <= 3600

    triggers = spec["triggers"]
    assert len(triggers) == 1
    trigger = triggers[0]
    assert trigger["type"] == "prometheus" and trigger.get("metricType", "AverageValue") == "AverageValue"
    meta = trigger["metadata"]
    assert all(isinstance(v, str) for v in meta.values()), "KEDA trigger metadata values are strings"
    assert {"serverAddress", "query", "threshold"} <= set(meta)
    assert re.fullmatch(r"https?://\S+", meta["serverAddress"])

    # the query reads gauges the server exports, summed over replicas
    gauges = re.findall(r"sum\((qtts_[a-z_]+)\{", meta["query"])
    assert sorted(gauges) == ["qtts_active_streams", "qtts_queue_depth"], meta["query"]
    metrics_source = (ROOT / "api" / "ops" / "metrics.py").read_text()
    for gauge in gauges:
        assert f'"{gauge}"' in metrics_source, f"/metrics has no {gauge}"
    # aim below the slots of one replica, so requests rarely queue
    server_env = env_of(container(one(docs, "Deployment")["spec"]["template"]["spec"], "server"))
    threshold = float(meta["threshold"])
    assert 0 < threshold <= int(server_env["QTTS_MAX_STREAMS"])


def test_wyoming_overlay_is_the_cpu_overlay_plus_its_port_and_service(rendered):
    """overlays/wyoming adds exactly Wyoming's setting, its container port and a Service of its own
    that reaches that port on the server pods; everything else is the CPU overlay's."""
    cpu, wyoming = copy.deepcopy(rendered["cpu"]), copy.deepcopy(rendered["wyoming"])
    deployment = one(wyoming, "Deployment")
    server = container(deployment["spec"]["template"]["spec"], "server")
    env = env_of(server)
    port = int(env["QTTS_WYOMING_PORT"])
    assert "--wyoming-port" in serve_flags() and "QTTS_WYOMING_HOST" not in env  # it binds QTTS_HOST's 0.0.0.0
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == {"http": PORT, "wyoming": port}

    service = one(wyoming, "Service", f"{NAME}-wyoming")
    assert service["spec"]["ports"] == [{"name": "wyoming", "port": port, "targetPort": "wyoming", "protocol": "TCP"}]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP", "no API key on Wyoming: exposing it is a choice"

    # the rest is the CPU overlay, object for object
    server["env"] = [e for e in server["env"] if e["name"] != "QTTS_WYOMING_PORT"]
    server["ports"] = [p for p in server["ports"] if p["name"] != "wyoming"]

    def normal(docs: list[dict]) -> list[dict]:
        """The objects in one order, each container's env in one order (patches put theirs first)."""
        for doc in docs:
            for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                c.get("env", []).sort(key=lambda e: e["name"])
        return sorted(docs, key=lambda d: (d["kind"], d["metadata"]["name"]))

    assert normal([d for d in wyoming if d is not service]) == normal(cpu)


def test_model_pull_job_fills_what_the_deployment_serves(rendered, tmp_path):
    job = one(rendered["model-pull"], "Job", "qwen3-tts-pull-models")
    spec = job["spec"]["template"]["spec"]
    pull = container(spec, "pull")
    env = env_of(pull)
    server_spec = one(rendered["cpu"], "Deployment")["spec"]["template"]["spec"]
    served = env_of(container(server_spec, "server"))["QTTS_MODEL"].split(",")

    def models_claim(pod_spec: dict) -> str:
        return next(v for v in pod_spec["volumes"] if v["name"] == "models")["persistentVolumeClaim"]["claimName"]

    assert models_claim(spec) == models_claim(server_spec)
    assert env["PULL_OUTPUT"] == next(m for m in pull["volumeMounts"] if m["name"] == "models")["mountPath"]
    repos = env["PULL_REPOS"].split(",")
    expected = [f"{env['PULL_OUTPUT']}/{repo.split('/')[-1]}-{env['PULL_QUANT']}" for repo in repos]
    assert expected == served, "the Job converts into the folders the Deployment serves"
    assert spec["securityContext"] == server_spec["securityContext"]  # files owned as the server reads them

    # both scripts run: with the models in place the Job skips them and the init container returns
    out = tmp_path / "models"
    for repo in env["PULL_REPOS"].split(","):
        folder = out / f"{repo.split('/')[-1]}-{env['PULL_QUANT']}"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text("{}")
    job_env = {**os.environ, **{k: v for k, v in env.items() if isinstance(v, str)}, "PULL_OUTPUT": str(out)}
    done = subprocess.run([sys.executable, "-c", pull["command"][2]], env=job_env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.count("present:") == len(served), done.stderr
    wait = container(server_spec, "wait-for-models", init=True)
    local = ",".join(str(out / Path(m).name) for m in served)
    done = subprocess.run([sys.executable, "-c", wait["command"][2]], env={**os.environ, "QTTS_MODEL": local},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_manifests_match_the_dockerfile(rendered):
    """Port, volumes, user and entry point of deploy/Dockerfile's images (every flavor's final stage)."""
    dockerfile = ROOT / "deploy" / "Dockerfile"
    if not dockerfile.is_file():
        pytest.skip("deploy/Dockerfile is not there yet")
    text = dockerfile.read_text()
    args = dict(re.findall(r"^\s*ARG\s+(\w+)=(\S+)", text, re.M))

    def expand(value: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), value)

    spec = one(rendered["cpu"], "Deployment")["spec"]["template"]["spec"]
    server = container(spec, "server")
    assert "command" not in server and "args" not in server, "the image's ENTRYPOINT/CMD run `serve`"
    assert set(re.findall(r"^\s*EXPOSE\s+(\d+)", text, re.M)) == {str(PORT)}
    volumes = " ".join(re.findall(r"^\s*VOLUME\s+(.+)$", text, re.M))
    for mount in server["volumeMounts"]:
        assert f'"{mount["mountPath"]}"' in volumes, f"{mount['mountPath']} is not a VOLUME of the image"
    users = {expand(u) for u in re.findall(r"^\s*USER\s+(\S+)", text, re.M)}
    context = spec["securityContext"]
    assert users == {f"{context['runAsUser']}:{context['runAsGroup']}"}, users
    assert re.search(r'^\s*ENTRYPOINT\s+\["python", "-m", "qwen3_tts_gguf"\]', text, re.M)
    assert re.search(r'^\s*CMD\s+\["serve"', text, re.M)


def test_the_flavors_final_stages_differ_only_in_the_flavor():
    """deploy/Dockerfile writes the final stage once per flavor (`--target cuda` alone must pick it; the
    Dockerfile says why it is not one stage): the three are the same text but for the flavor's name,
    each on its own runtime and build stage, and the CPU one is last, the default target."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    stages = re.split(r"^(?=FROM\s)", text, flags=re.M)[1:]
    names = [re.match(r"FROM\s+\S+\s+AS\s+(\S+)", s, re.I).group(1) for s in stages]
    assert names[-1] == "cpu", "the CPU image is the default target: the last stage"
    finals = {}
    for stage, name in zip(stages, names):
        if name in ("cpu", "cuda", "vulkan"):
            lines = [line.rstrip() for line in stage.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            assert lines[0] == f"FROM {name}-runtime AS {name}"
            assert f"COPY --from={name}-build /opt/qtts /opt/qtts" in lines
            assert f'qwen3-tts-x.flavor="{name}"' in " ".join(lines)
            finals[name] = [re.sub(rf"\b{name}\b", "FLAVOR", line) for line in lines]
    assert sorted(finals) == ["cpu", "cuda", "vulkan"]
    assert finals["cuda"] == finals["cpu"] and finals["vulkan"] == finals["cpu"], "keep the final stages alike"


def test_every_llama_build_is_the_one_recipe():
    """The images and the host's builds compile llama.cpp with scripts/build-llama.sh only, so the
    image recipes cannot drift from the host's (the images are not built in CI)."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "CMAKE_ARGS" not in dockerfile, "llama.cpp is built by scripts/build-llama.sh, not by a pip line"
    for backend in ("cpu", "cuda", "vulkan"):
        assert re.search(rf"build-llama\.sh {backend} ", dockerfile), f"the {backend} build stage"
    assert "!scripts/build-llama.sh" in (ROOT / ".dockerignore").read_text().splitlines()
    for script in ("build-vulkan.sh", "build-wheelhouse.sh"):
        text = (ROOT / "scripts" / script).read_text()
        assert "scripts/build-llama.sh" in text and "CMAKE_ARGS=" not in text, script
    usage = subprocess.run(["bash", str(ROOT / "scripts" / "build-llama.sh"), "metal", "/tmp/x"],
                           capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "cpu|vulkan|cuda" in usage.stderr
