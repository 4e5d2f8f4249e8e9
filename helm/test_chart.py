#!/usr/bin/env python3
"""Checks of the chart in helm/tessel, run by ./scripts/test:

* `helm lint --strict` of the default values and every preset;
* `helm template` of each, validated strictly with kubernetes-validate
  for Kubernetes 1.30 to 1.35 (cert-manager and Prometheus Operator kinds
  have no schema there: they are checked by the assertions instead);
* assertions on the rendered objects, helm-unittest style: the PDB keeps a
  quorum for 3, 5, 7 replicas, the peers list, GPU and TPU resources, the
  TPU shapes of README's table, one node pool per slice, workers as
  StatefulSets (and in a user's image), the TLS mounts, probes, the
  ServiceMonitor's selection;
* Pod Security "restricted" for every pod of every preset (its rules,
  written out below), no service account tokens, fsGroup everywhere;
* every schema rejection tried and refused with its message.

Usage: helm/test_chart.py HELM KUBERNETES_VALIDATE (run with a Python that
has PyYAML: kubernetes-validate's).
"""

import json
import subprocess
import sys
import tempfile
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


# The rendered manifests, for kubernetes-validate: in a folder of this
# run's own, removed when the run ends however it ends.
RENDERED = tempfile.TemporaryDirectory(prefix="tessel-chart-")
counts = {}
for preset in PRESETS:
    r = subprocess.run([HELM, "lint", "--strict", str(CHART), *values_args(preset)],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"helm lint --strict ({preset}): {r.stdout}{r.stderr}")
    rendered = template(values_args(preset)).stdout
    path = Path(RENDERED.name) / f"{preset}.yaml"
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
# Identity: in the default perPod mode every tessel pod gets its own
# certificate from cert-manager's csi-driver, naming its role and its pod
# name; no pod mounts the CA's Secret; the CA outlives its leaves.
ROLES = {"coordinator": "coordinator", "worker": "worker"}
identities = set()
for o in find(objs, "StatefulSet") + find(objs, "Pod"):
    spec = o["spec"] if o["kind"] == "Pod" else o["spec"]["template"]["spec"]
    role = "client" if o["kind"] == "Pod" else ROLES[o["metadata"]["labels"]["app.kubernetes.io/component"]]
    vols = {v["name"]: v for v in spec["volumes"]}
    csi = vols["tls"].get("csi", {})
    attrs = csi.get("volumeAttributes", {})
    check(csi.get("driver") == "csi.cert-manager.io" and csi.get("readOnly")
          and attrs.get("csi.cert-manager.io/issuer-name") == "t-tessel-ca"
          and attrs.get("csi.cert-manager.io/uri-sans") == f"tessel://{role}/${{POD_NAME}}"
          and "tessel" in attrs["csi.cert-manager.io/dns-names"].split(",")
          and [attrs.get(f"csi.cert-manager.io/{k}") for k in ("ca-file", "certificate-file", "privatekey-file")]
          == ["ca.pem", "node.pem", "node.key"]
          and attrs.get("csi.cert-manager.io/fs-group") == str(spec["securityContext"]["fsGroup"]),
          f"{o['metadata']['name']}: a per-pod {role} certificate from the csi-driver")
    check(("client auth" in attrs["csi.cert-manager.io/key-usages"])
          and (("server auth" in attrs["csi.cert-manager.io/key-usages"]) == (role != "client")),
          f"{o['metadata']['name']}: key usages of a {role}")
    check(not any(v.get("secret", {}).get("secretName") == "t-tessel-ca" for v in vols.values()),
          f"{o['metadata']['name']}: the CA's key is mounted in no pod")
    names = ([o["metadata"]["name"]] if o["kind"] == "Pod"
             else [f"{o['metadata']['name']}-{i}" for i in range(o["spec"]["replicas"])])
    for n in names:
        identities.add(attrs["csi.cert-manager.io/uri-sans"].replace("${POD_NAME}", n))
    for ct in spec["containers"]:
        check({"name": "tls", "mountPath": "/tls", "readOnly": True} in ct["volumeMounts"], f"{ct['name']}: /tls mount")
pods = sum(1 if o["kind"] == "Pod" else o["spec"]["replicas"] for o in find(objs, "StatefulSet") + find(objs, "Pod"))
check(len(identities) == pods, f"each of the {pods} pods has an identity of its own: {sorted(identities)}")
certs = find(objs, "Certificate")
ca = [c for c in certs if c["spec"].get("isCA")]
check(len(certs) == 1 and ca and ca[0]["spec"]["duration"] == "87600h",
      "perPod: only the CA is a Certificate, and it lives ten years")
coord_attrs = find(objs, "StatefulSet")[0]["spec"]["template"]["spec"]["volumes"]
coord_dns = next(v for v in coord_attrs if v["name"] == "tls")["csi"]["volumeAttributes"]["csi.cert-manager.io/dns-names"]
check("${POD_NAME}.t-tessel-coordinator-peers.${POD_NAMESPACE}.svc" in coord_dns.split(",")
      and "t-tessel-coordinator.${POD_NAMESPACE}.svc" in coord_dns.split(","),
      "a coordinator's certificate names the addresses it is dialed at")
# People and CI: a client Certificate each.
clients = [c for c in find(objects(["--set", "tls.clients={alice,ci-bot}"]), "Certificate") if not c["spec"].get("isCA")]
check(sorted(c["spec"]["uris"][0] for c in clients) == ["tessel://client/alice", "tessel://client/ci-bot"]
      and all(c["spec"]["usages"] == ["client auth", "digital signature"] for c in clients)
      and sorted(c["spec"]["secretName"] for c in clients) == ["t-tessel-client-alice", "t-tessel-client-ci-bot"],
      "tls.clients: a client certificate per person, nothing more")
# A trust bundle (trust-manager) replaces the issuer's CA while a CA rotates.
bundled = objects(["--set", "tls.trustBundle.configMap=tessel-trust"])
for o in find(bundled, "StatefulSet"):
    spec = o["spec"]["template"]["spec"]
    c = spec["containers"][0]
    check(any(v.get("configMap", {}).get("name") == "tessel-trust" for v in spec["volumes"])
          and "--tls-ca" in c["args"] and c["args"][c["args"].index("--tls-ca") + 1] == "/trust/ca.pem"
          and {"name": "trust", "mountPath": "/trust", "readOnly": True} in c["volumeMounts"],
          f"{o['metadata']['name']}: trusts the bundle")
# shared mode: one Secret for every pod (documented as weaker).
shared = objects(["--set", "tls.mode=shared"])
for o in find(shared, "StatefulSet") + find(shared, "Pod"):
    spec = o["spec"] if o["kind"] == "Pod" else o["spec"]["template"]["spec"]
    tls = [v for v in spec["volumes"] if v["name"] == "tls"][0]["secret"]
    check(tls["secretName"] == "t-tessel-tls" and {i["path"] for i in tls["items"]} == {"ca.pem", "node.pem", "node.key"},
          f"shared: {o['metadata']['name']}: TLS secret items")
cert = [o for o in find(shared, "Certificate") if not o["spec"].get("isCA")][0]
check("*.t-tessel-coordinator-peers.ml.svc" in cert["spec"]["dnsNames"] and "127.0.0.1" in cert["spec"]["ipAddresses"],
      "the shared certificate names the peers' wildcard and the loopback")
check(not find(objects(["--set", "tls.mode=shared", "--set", "tls.existingSecret=mine"]), "Certificate"),
      "an existing Secret replaces cert-manager")
for args, why in [(["--set", "tls.existingSecret=mine"], "set tls.mode=shared to use it"),
                  (["--set", "tls.certManager.enabled=false"], "tls.mode=perPod needs cert-manager"),
                  (["--set", "tls.mode=both"], "/tls/mode"),
                  (["--set", "tls.clients={a/b}"], "/tls/clients/0")]:
    r = template(args, ok=False)
    check(r.returncode != 0 and why in r.stderr, f"refused: {args}: {r.stderr.strip()[:200]}")

def pod_specs(objs):
    """(name, pod spec) of every pod the objects make."""
    out = []
    for o in objs:
        if o["kind"] == "Pod":
            out.append((o["metadata"]["name"], o["spec"]))
        elif o["kind"] in ("StatefulSet", "Deployment", "DaemonSet", "Job"):
            out.append((o["metadata"]["name"], o["spec"]["template"]["spec"]))
    return out


# Pod Security Standards, "restricted" (kubernetes.io/docs/concepts/security/
# pod-security-standards, v1.30+): every rule of the baseline and restricted
# profiles that a pod spec can break.
VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                "projected", "secret"}


def restricted_violations(name, spec):
    bad = []
    psc = spec.get("securityContext", {})
    for k in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(k):
            bad.append(f"{name}: {k}")
    for v in spec.get("volumes", []):
        kinds = set(v) - {"name"}
        if not kinds <= VOLUME_TYPES:
            bad.append(f"{name}: volume {v['name']} of type {kinds - VOLUME_TYPES}")
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        where = f"{name}/{c['name']}"
        if sc.get("privileged"):
            bad.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{where}: allowPrivilegeEscalation must be false")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            bad.append(f"{where}: capabilities must drop ALL")
        if set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{where}: capabilities added")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
            bad.append(f"{where}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            bad.append(f"{where}: runAsUser 0")
        prof = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if prof not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{where}: seccompProfile {prof}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append(f"{where}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"{where}: procMount")
    return bad


USER_IMAGE = ["--set", "workers.image.repository=example.com/team/jax", "--set-string", "workers.image.tag=0.10.2"]
for preset in PRESETS:
    for extra in ([], USER_IMAGE):
        objs = objects(values_args(preset) + extra)
        for name, spec in pod_specs(objs):
            v = restricted_violations(name, spec)
            check(not v, f"Pod Security restricted ({preset}{' user image' if extra else ''}): {v}")
            check(spec.get("automountServiceAccountToken") is False, f"{name}: no service account token")
            check(spec["securityContext"].get("fsGroup") == 10001,
                  f"{name}: fsGroup, or the kubelet's 0400 root-owned key is unreadable")
# The check itself refuses what the profile refuses.
check(restricted_violations("p", {"containers": [{"name": "c"}]}), "the restricted check refuses an empty context")

# Workers: a StatefulSet per slice (replaced on any exit, rolled on upgrade).
objs = objects(values_args("cpu"))
ws = [o for o in find(objs, "StatefulSet") if o["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"]
check(len(ws) == 1 and ws[0]["spec"]["replicas"] == 2 and ws[0]["spec"]["updateStrategy"]["type"] == "RollingUpdate"
      and ws[0]["spec"]["template"]["spec"].get("restartPolicy", "Always") == "Always", "workers as a StatefulSet")
check(not find(objs, "Job"), "no Job: its template is immutable and exit 0 would end an index")
c = container(ws[0])
check(c["args"][c["args"].index("--host-name") + 1] == "$(POD_NAME).t-tessel-worker-hosts.$(POD_NAMESPACE).svc",
      f"workers advertise HOST.SUBDOMAIN: {c['args']}")

# The user's image: tessel copied in by an init container from tessel's image.
ws = [o for o in find(objects(USER_IMAGE), "StatefulSet") if "worker" in o["metadata"]["name"]][0]
spec = ws["spec"]["template"]["spec"]
init = spec["initContainers"][0]
c = spec["containers"][0]
check(init["image"] == "tessel:0.1.0-cpu" and init["args"] == ["install", "/tessel-out"], f"init container: {init}")
check(c["image"] == "example.com/team/jax:0.10.2" and c["command"] == ["/opt/tessel/bin/tessel"], f"worker: {c}")
check(env(c)["TESSEL_PLUGIN_DIR"] == "/opt/tessel/plugins", "plugins from the shared volume")

# GPU: devices, NCCL, plugin, /dev/shm in memory.
ws = [o for o in find(objects(values_args("gpu")), "StatefulSet") if "worker" in o["metadata"]["name"]][0]
c = container(ws)
check(c["resources"]["limits"]["nvidia.com/gpu"] == 8, "GPU limit")
check(env(c)["NCCL_SOCKET_IFNAME"] == "eth0" and env(c)["NCCL_DEBUG"] == "WARN", "NCCL env")
check(c["args"][c["args"].index("--plugin") + 1] == "cuda", "GPU plugin")
shm = [v for v in ws["spec"]["template"]["spec"]["volumes"] if v["name"] == "shm"][0]
check(shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}, f"shm: {shm}")
check(ws["spec"]["replicas"] == 4 and "affinity" not in ws["spec"]["template"]["spec"], "GPU workers")

# TPU, two slices of v5e 4x4: a StatefulSet per slice of 4 hosts with 4
# chips each, one node pool per slice, and no TPU variables in the chart
# (the worker decides them, from the platform's or from resolvable names).
sets = [o for o in find(objects(values_args("tpu")), "StatefulSet") if "worker" in o["metadata"]["name"]]
check(len(sets) == 2, f"TPU slices: {len(sets)} sets")
for s, ws in enumerate(sets):
    spec = ws["spec"]["template"]["spec"]
    c = container(ws)
    check(ws["spec"]["replicas"] == 4, f"slice {s}: 4 hosts")
    check(c["resources"]["limits"]["google.com/tpu"] == 4, "TPU limit")
    check(c["args"][c["args"].index("--plugin") + 1] == "tpu", "TPU plugin")
    check(c["args"][c["args"].index("--slice") + 1] == str(s), "slice index")
    check(not [k for k in env(c) if k.startswith(("TPU_", "MEGASCALE_"))], f"TPU variables set in one place: {env(c)}")
    aff = spec["affinity"]
    together = aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    apart = aff["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    check(together["topologyKey"] == apart["topologyKey"] == "cloud.google.com/gke-nodepool"
          and together["labelSelector"]["matchLabels"]["tessel.dev/slice"] == str(s)
          and apart["labelSelector"]["matchExpressions"][0]["values"] == [str(s)], f"one node pool per slice: {aff}")
    check(spec["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4", "TPU node selector")

# The shapes of README's table: (type, topology) -> chips per host, hosts.
for typ, topo, chips, hosts in [
    ("tpu-v4-podslice", "2x2x1", 4, 1), ("tpu-v4-podslice", "2x2x4", 4, 4),
    ("tpu-v5p-slice", "2x2x1", 4, 1), ("tpu-v5p-slice", "4x4x4", 4, 16),
    ("tpu-v5-lite-podslice", "1x1", 1, 1), ("tpu-v5-lite-podslice", "2x4", 8, 1),
    ("tpu-v5-lite-podslice", "4x4", 4, 4), ("tpu-v5-lite-podslice", "16x16", 4, 64),
    ("tpu-v6e-slice", "2x2", 4, 1), ("tpu-v6e-slice", "8x8", 4, 16),
]:
    objs = objects(["--set", "workers.accelerator=tpu", "--set", f"workers.tpu.acceleratorType={typ}",
                    "--set", f"workers.tpu.topology={topo}", "--set", f"workers.count={hosts}"])
    ws = [o for o in find(objs, "StatefulSet") if "worker" in o["metadata"]["name"]][0]
    check(ws["spec"]["replicas"] == hosts and container(ws)["resources"]["limits"]["google.com/tpu"] == chips,
          f"{typ} {topo}: {ws['spec']['replicas']} hosts of {container(ws)['resources']['limits']['google.com/tpu']} chips")

# ServiceMonitor: one Service per component, and the labels Prometheus wants.
objs = objects(["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=kps"])
sm = find(objs, "ServiceMonitor")[0]
sel = sm["spec"]["selector"]["matchLabels"]
picked = [o["metadata"]["name"] for o in find(objs, "Service")
          if all(o["metadata"]["labels"].get(k) == v for k, v in sel.items())]
check(sorted(picked) == ["t-tessel-coordinator-peers", "t-tessel-worker-hosts"], f"ServiceMonitor selects {picked}")
check(sm["metadata"]["labels"].get("release") == "kps", "ServiceMonitor labels")

# Every rejection, with its message.
for args, words in [
    (["--set", "coordinators.replicas=4"], "must be one of 3, 5, 7, 9"),
    (["--set", "coordinators.replicas=1"], "must be one of 3, 5, 7, 9"),
    (["--set", "workers.count=0"], "/workers/count"),
    (["--set", "workers.accelerator=fpga"], "/workers/accelerator"),
    (values_args("tpu") + ["--set", "workers.gpu.count=2"], "/workers/gpu"),
    (values_args("gpu") + ["--set", "workers.tpu.count=2"], "/workers/tpu"),
    (["--set", "workers.accelerator=tpu", "--set", "workers.tpu.count=4"], "acceleratorType is required"),
    (values_args("tpu") + ["--set", "workers.count=4"], "set workers.count=8"),
    (values_args("tpu") + ["--set", "workers.count=7"], "set workers.count=8"),
    (values_args("tpu") + ["--set", "workers.tpu.count=8"], "has 4 chips"),
    (values_args("tpu") + ["--set", "workers.tpu.topology=2x2x2"], "2-D (AxB)"),
    (values_args("tpu") + ["--set", "workers.tpu.acceleratorType=tpu-v4-podslice"], "3-D (AxBxC)"),
    (values_args("tpu") + ["--set", "workers.tpu.acceleratorType=tpu-v9"], "/workers/tpu/acceleratorType"),
    (["--set", "workers.terminationGracePeriodSeconds=5"], "must exceed workers.preemptGraceMs"),
]:
    r = template(args, ok=False)
    check(r.returncode != 0 and words in r.stderr, f"rejected {args}: {r.stderr.strip()[:300]}")

print(json.dumps({"objects_per_preset": counts, "kubernetes_versions": VERSIONS}))
if failures:
    raise SystemExit(f"{len(failures)} chart checks failed")
print("chart: every check passed")
