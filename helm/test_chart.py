#!/usr/bin/env python3
"""Checks of the chart in helm/tessel, run by ./scripts/test:

* `helm lint --strict` of the default values and every preset;
* `helm template` of each, validated strictly with kubernetes-validate
  for Kubernetes 1.30 to 1.35 (cert-manager and Prometheus Operator kinds
  have no schema there: they are checked by the assertions instead);
* assertions on the rendered objects, helm-unittest style: the PDB keeps a
  quorum for 3, 5, 7 replicas, the peers list, GPU and TPU resources and
  environment, the TLS mounts, probes and security contexts;
* every schema rejection tried and refused with its message.

Usage: helm/test_chart.py HELM KUBERNETES_VALIDATE (run with a Python that
has PyYAML: kubernetes-validate's).
"""

import json
import subprocess
import sys
from pathlib import Path

import yaml

HELM, VALIDATE = sys.argv[1], sys.argv[2]
CHART = Path(__file__).resolve().parent / "tessel"
PRESETS = ["default", "cpu", "gpu", "tpu"]
VERSIONS = ["1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0"]
NS = "ml"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL {what}", file=sys.stderr)


def values_args(preset):
    return [] if preset == "default" else ["-f", str(CHART / "presets" / f"{preset}.yaml")]


def template(args, ok=True):
    r = subprocess.run([HELM, "template", "t", str(CHART), "-n", NS, *args],
                       capture_output=True, text=True)
    if ok and r.returncode != 0:
        raise SystemExit(f"helm template {args} failed:\n{r.stderr}")
    return r


def objects(args):
    return [o for o in yaml.safe_load_all(template(args).stdout) if o]


def find(objs, kind, name=None):
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def container(obj):
    return obj["spec"]["template"]["spec"]["containers"][0]


def env(c):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


counts = {}
for preset in PRESETS:
    r = subprocess.run([HELM, "lint", "--strict", str(CHART), *values_args(preset)],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"helm lint --strict ({preset}): {r.stdout}{r.stderr}")
    rendered = template(values_args(preset)).stdout
    path = Path(f"/tmp/tessel-chart-{preset}.yaml")
    path.write_text(rendered)
    objs = [o for o in yaml.safe_load_all(rendered) if o]
    counts[preset] = {}
    for o in objs:
        counts[preset][o["kind"]] = counts[preset].get(o["kind"], 0) + 1
    for v in VERSIONS:
        r = subprocess.run([VALIDATE, "--strict", "-k", v, str(path)], capture_output=True, text=True)
        bad = [l for l in (r.stdout + r.stderr).splitlines()
               if " passed " not in l and "Couldn't find schema" not in l and l.strip()]
        check(r.returncode == 0 and not bad, f"kubernetes-validate {v} ({preset}): {bad}")

# The PDB keeps a quorum; the peers are every replica's stable name.
for n, allowed in [(3, 1), (5, 2), (7, 3)]:
    objs = objects(["--set", f"coordinators.replicas={n}"])
    pdb = find(objs, "PodDisruptionBudget")[0]
    check(pdb["spec"]["maxUnavailable"] == allowed, f"PDB for {n}: {pdb['spec']}")
    sts = find(objs, "StatefulSet")[0]
    check(sts["spec"]["replicas"] == n and sts["spec"]["podManagementPolicy"] == "Parallel", "statefulset")
    c = container(sts)
    values = {e["name"]: e.get("value") for e in c.get("env", [])}
    check("--peers-from-env" in c["args"] and "--peers" not in c["args"], f"peers derived: {c['args']}")
    check(values.get("TESSEL_REPLICAS") == str(n)
          and values.get("TESSEL_PEER_DOMAIN") == f"t-tessel-coordinator-peers.{NS}.svc",
          f"peers' environment for {n}: {values}")

objs = objects([])
headless = find(objs, "Service", "t-tessel-coordinator-peers")[0]
check(headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"], "headless peers service")
sts = find(objs, "StatefulSet")[0]
pod = sts["spec"]["template"]["spec"]
check(pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"]
      == "kubernetes.io/hostname", "required anti-affinity on the hostname")
check(pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone", "zone spread")
c = container(sts)
check(c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz", "probes")
sc = c["securityContext"]
check(sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"], "security context")
check(sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "10Gi", "data volume")
# Every tessel container mounts the TLS folder, its keys renamed as tessel reads them.
for o in find(objs, "StatefulSet") + find(objs, "Job") + find(objs, "Pod"):
    spec = o["spec"] if o["kind"] == "Pod" else o["spec"]["template"]["spec"]
    tls = [v for v in spec["volumes"] if v["name"] == "tls"][0]["secret"]
    check(tls["secretName"] == "t-tessel-tls" and {i["path"] for i in tls["items"]} == {"ca.pem", "node.pem", "node.key"},
          f"{o['metadata']['name']}: TLS secret items")
    for ct in spec["containers"]:
        check({"name": "tls", "mountPath": "/tls", "readOnly": True} in ct["volumeMounts"], f"{ct['name']}: /tls mount")
cert = [o for o in find(objs, "Certificate") if not o["spec"].get("isCA")][0]
check("*.t-tessel-coordinator-peers.ml.svc" in cert["spec"]["dnsNames"] and "127.0.0.1" in cert["spec"]["ipAddresses"],
      "the shared certificate names the peers' wildcard and the loopback")
check(not find(objects(["--set", "tls.existingSecret=mine"]), "Certificate"), "an existing Secret replaces cert-manager")

# GPU: devices, NCCL, plugin, /dev/shm in memory.
job = find(objects(values_args("gpu")), "Job")[0]
c = container(job)
check(c["resources"]["limits"]["nvidia.com/gpu"] == 8, "GPU limit")
check(env(c)["NCCL_SOCKET_IFNAME"] == "eth0" and env(c)["NCCL_DEBUG"] == "WARN", "NCCL env")
check(c["args"][c["args"].index("--plugin") + 1] == "cuda", "GPU plugin")
shm = [v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "shm"][0]
check(shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}, f"shm: {shm}")
check(job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 4, "indexed job")

# TPU, two slices: one Job per slice, libtpu's hosts and multislice variables.
jobs = find(objects(values_args("tpu")), "Job")
check(len(jobs) == 2, f"TPU slices: {len(jobs)} jobs")
for s, job in enumerate(jobs):
    c = container(job)
    e = env(c)
    check(c["resources"]["limits"]["google.com/tpu"] == 4, "TPU limit")
    check(c["args"][c["args"].index("--plugin") + 1] == "tpu", "TPU plugin")
    hosts = e["TPU_WORKER_HOSTNAMES"].split(",")
    check(hosts == [f"t-tessel-worker-s{s}-{i}.t-tessel-worker-hosts.ml.svc" for i in range(2)], f"TPU hosts: {hosts}")
    check(e["MEGASCALE_NUM_SLICES"] == "2" and e["MEGASCALE_SLICE_ID"] == str(s), "multislice env")
    check("job-completion-index" in json.dumps(e["TPU_WORKER_ID"]), "TPU_WORKER_ID from the index")
    sel = job["spec"]["template"]["spec"]["nodeSelector"]
    check(sel["cloud.google.com/gke-tpu-topology"] == "4x4", "TPU node selector")

# Every rejection, with its message.
for args, words in [
    (["--set", "coordinators.replicas=4"], "must be one of 3, 5, 7, 9"),
    (["--set", "coordinators.replicas=1"], "must be one of 3, 5, 7, 9"),
    (["--set", "workers.count=0"], "/workers/count"),
    (["--set", "workers.accelerator=fpga"], "/workers/accelerator"),
    (values_args("tpu") + ["--set", "workers.gpu.count=2"], "/workers/gpu"),
    (values_args("gpu") + ["--set", "workers.tpu.count=2"], "/workers/tpu"),
    (["--set", "workers.accelerator=tpu", "--set", "workers.tpu.count=4"], "acceleratorType is required"),
]:
    r = template(args, ok=False)
    check(r.returncode != 0 and words in r.stderr, f"rejected {args}: {r.stderr.strip()[:300]}")

print(json.dumps({"objects_per_preset": counts, "kubernetes_versions": VERSIONS}))
if failures:
    raise SystemExit(f"{len(failures)} chart checks failed")
print("chart: every check passed")
