#!/usr/bin/env python3
"""The chart runs: renders helm/tessel (the CPU preset, small sizes, the
workers in a user's image) and runs its pods through helm/kubelet.py, a
strict imitation of a kubelet and the cluster's DNS (its docstring says
what it models and what not), then, in order:

1. a pod whose certificate volume names no group cannot read its key
   (what the csi-driver writes: root-owned, 0440), so every pod must and
   does name its fsGroup;
2. the workers, in a Python+JAX image that does not contain tessel (an
   init container copies it in), register, each pod under a certificate of
   its own (tessel://ROLE/POD, from the csi-driver imitation, helm/csi.py);
3. the MLP demo (a plan job) succeeds; then every pod's certificate is
   renewed (a new key) and every tessel process adopts it within seconds,
   without a restart (the expiry it reports is the new certificate's);
4. a JAX program as a 2-process command job succeeds with the same final
   weights as one process of the same image, and its output is in the
   workers' own logs (what `kubectl logs` shows), prefixed;
5. inside a worker, the other workers resolve as POD.SUBDOMAIN and not by
   their short names (what libtpu's host list is built from);
6. an evicted worker (SIGTERM, exit 0) is replaced by its StatefulSet and
   registers again;
7. `helm test` passes; with 2 of 3 coordinators stopped it fails.

Usage: helm/run_chart.py HELM IMAGE USER_IMAGE (a Python with PyYAML).
Removes every container, network and folder it made, however it ends.
"""

import calendar
import copy
import os
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kubelet import Cluster, sh  # noqa: E402

HELM, IMAGE, USER_IMAGE = sys.argv[1], sys.argv[2], sys.argv[3]
REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "tessel"
NS = "ml"
TAG = f"tesselchart{os.getpid()}"
JAX_JOB = """name = "jax-in-user-image"
processes = 2
command = ["python3", "train.py", "--steps", "40"]
files = ["train.py"]
max_restarts = 1
[env]
XLA_FLAGS = "--xla_force_host_platform_device_count=2"
JAX_PLATFORMS = "cpu"
"""


def split(image):
    return image.rsplit(":", 1)


def render():
    repo, tag = split(IMAGE)
    urepo, utag = split(USER_IMAGE)
    out = sh(HELM, "template", "t", str(CHART), "-n", NS,
             "-f", str(CHART / "presets" / "cpu.yaml"),
             "--set", f"image.repository={repo}", "--set-string", f"image.tag={tag}",
             "--set", f"workers.image.repository={urepo}", "--set-string", f"workers.image.tag={utag}",
             "--set", "workers.count=2", "--set", "workers.shmSize=256Mi").stdout
    return [o for o in yaml.safe_load_all(out) if o]


def issuers(objs, workdir):
    """The CA Issuer cert-manager would run: the chart's CA (a Certificate
    with isCA, made here with `tessel certs init --ca-only`)."""
    ca = next(o for o in objs if o["kind"] == "Certificate" and o["spec"].get("isCA"))
    issuer = next(o for o in objs if o["kind"] == "Issuer" and o["spec"].get("ca", {}).get("secretName")
                  == ca["spec"]["secretName"])
    d = workdir / "ca"
    sh(str(REPO / "target/debug/tessel"), "certs", "init", str(d), "--ca-only")
    return {issuer["metadata"]["name"]: d}


def san_uri(pem_path):
    """The URI subject alternative name of a certificate file."""
    out = sh("openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(pem_path)).stdout
    return re.findall(r"URI:(\S+?)(?:,|$)", out, re.M)


def not_after(pem_path):
    """A certificate's expiry, seconds since the epoch."""
    out = sh("openssl", "x509", "-noout", "-enddate", "-in", str(pem_path)).stdout.strip()
    return calendar.timegm(time.strptime(out.split("=", 1)[1], "%b %d %H:%M:%S %Y %Z"))


def submitter(test_pod, name, args):
    """A submitter pod as NOTES.txt describes it: the test pod's security
    context and TLS Secret, one container of tessel's image."""
    pod = copy.deepcopy(test_pod)
    pod["metadata"]["name"] = name
    c = copy.deepcopy(pod["spec"]["containers"][0])
    c["name"], c["args"] = "submit", args
    pod["spec"]["containers"] = [c]
    return pod


def main(workdir):
    objs = render()
    pid = os.getpid()
    cluster = Cluster(TAG, NS, workdir, {}, subnet=f"10.{100 + pid % 50}.{pid % 250}",
                      dns_image=USER_IMAGE, issuers=issuers(objs, workdir))
    try:
        scenario(cluster, objs, workdir)
    except BaseException:
        for name in sh("docker", "ps", "-a", "--format", "{{.Names}}", "--filter", f"name={TAG}-").stdout.split():
            r = sh("docker", "logs", "--tail", "25", name, ok=False)
            print(f"--- {name} (last lines)\n{r.stdout}{r.stderr}", file=sys.stderr)
        raise
    finally:
        cluster.cleanup()


def scenario(cluster, objs, workdir):
    cluster.apply(objs)
    sets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "StatefulSet"}
    coord = next(s for s in sets.values() if s["metadata"]["labels"]["app.kubernetes.io/component"] == "coordinator")
    workers = next(s for s in sets.values() if s["metadata"]["labels"]["app.kubernetes.io/component"] == "worker")
    test_pod = next(o for o in objs if o["kind"] == "Pod")
    addrs = test_pod["spec"]["containers"][0]["args"][3]
    tls = ["--coordinator", addrs, "--tls-dir", "/tls"]

    # 1. The csi-driver's files are unreadable to uid 10001 unless the
    #    volume names the pod's group.
    bare = copy.deepcopy(test_pod)
    bare["metadata"]["name"] = "no-fsgroup"
    del bare["spec"]["securityContext"]["fsGroup"]
    tls_vol = next(v for v in bare["spec"]["volumes"] if v["name"] == "tls")
    del tls_vol["csi"]["volumeAttributes"]["csi.cert-manager.io/fs-group"]
    (name, code, out), *_ = cluster.run_once(bare)
    if code == 0 or "node.key" not in out:
        raise SystemExit(f"a pod read a key of another group (exit {code}): the imitation is too kind\n{out}")
    for o in objs:
        spec = o.get("spec", {}).get("template", {}).get("spec") or (o["spec"] if o["kind"] == "Pod" else None)
        if not spec:
            continue
        group = spec.get("securityContext", {}).get("fsGroup")
        vol = next(v for v in spec["volumes"] if v["name"] == "tls")
        if group != 10001 or vol["csi"]["volumeAttributes"].get("csi.cert-manager.io/fs-group") != str(group):
            raise SystemExit(f"{o['kind']} {o['metadata']['name']}: its certificate volume does not name its fsGroup")
    print("a certificate volume without the pod's group is unreadable; every pod names it")

    cluster.start_statefulset(coord)
    cluster.start_statefulset(workers)
    registered = wait_workers(cluster, test_pod, tls, 2, "workers in the user's image")
    pods = [(p, "coordinator") for p in sts_pods(coord)] + [(p, "worker") for p in sts_pods(workers)]
    for pod, role in pods:
        uris = san_uri(workdir / pod / "tls" / "node.pem")
        if uris != [f"tessel://{role}/{pod}"]:
            raise SystemExit(f"{pod}: its certificate names {uris}, not tessel://{role}/{pod}")
    if sorted(registered) != sts_pods(workers):
        raise SystemExit(f"the workers registered as {sorted(registered)}, not as their pods")
    print(f"each of {len(pods)} pods runs as its own identity (tessel://ROLE/POD); workers registered as their pods")

    job = workdir / "job"
    job.mkdir(mode=0o755)
    for f in (REPO / "examples/mlp-data-parallel").iterdir():
        (job / f.name).write_bytes(f.read_bytes())
    (job / "train.py").write_bytes((REPO / "examples/jax-launch/train.py").read_bytes())
    (job / "jax.toml").write_text(JAX_JOB)
    for f in job.iterdir():
        f.chmod(0o644)
    ship = ["--mount", f"type=bind,src={job},dst=/job,readonly"]

    # 3. A plan job.
    started = time.time()
    (_, code, out), = cluster.run_once(submitter(test_pod, "submit-mlp", ["submit", "/job/job-2x2.toml", "--wait", *tls]), ship)
    if code != 0 or "Succeeded" not in out:
        raise SystemExit(f"the MLP demo did not succeed (exit {code}):\n{out}")
    print(f"the MLP demo succeeded in {time.time() - started:.1f} s")
    renewals(cluster, pods, workdir)

    # 4. A JAX command job in the user's image, against one process of it.
    started = time.time()
    (_, code, out), = cluster.run_once(submitter(test_pod, "submit-jax", ["submit", "/job/jax.toml", "--wait", *tls]), ship)
    if code != 0:
        raise SystemExit(f"the JAX job did not succeed (exit {code}):\n{out}\n{worker_logs(cluster, workers)}")
    print(f"a 2-process JAX job in the user's image succeeded in {time.time() - started:.1f} s")
    ref = sh("docker", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
             "-e", "HOME=/tmp", "--mount", f"type=bind,src={job},dst=/job,readonly", USER_IMAGE,
             "python3", "/job/train.py", "--steps", "40").stdout
    want = final_w(ref)
    logs = worker_logs(cluster, workers)
    got = re.findall(r"^\[jax-in-user-image[^@\]]*@\d+ p0\] final w (.*)$", logs, re.M)
    if not got:
        raise SystemExit(f"the job's output is not in the workers' logs:\n{logs[-3000:]}")
    got = [float(x) for x in got[-1].split()]
    if len(got) != len(want) or any(abs(a - b) > 1e-5 * max(1.0, abs(b)) for a, b in zip(got, want)):
        raise SystemExit(f"final weights differ from one process's: {got} vs {want}")
    lines = len(re.findall(r"^\[jax-in-user-image", logs, re.M))
    print(f"final weights equal one process's (within 1e-5); output in `kubectl logs`: {lines} prefixed lines")

    # 5. Names as a pod's DNS gives them.
    hosts = sts_pods(workers)
    me, other = hosts[0], hosts[1]
    sub = workers["spec"]["serviceName"]
    full = cluster.exec(me, "getent", "hosts", f"{other}.{sub}")
    short = cluster.exec(me, "getent", "hosts", other)
    if full.returncode != 0 or short.returncode == 0:
        raise SystemExit(f"DNS: {other}.{sub} -> {full.returncode}, {other} -> {short.returncode}")
    print(f"in {me}: {other}.{sub} resolves, {other} does not")

    # 6. Eviction: SIGTERM, exit 0, replaced by the StatefulSet.
    code = cluster.evict_and_replace(workers, hosts[1])
    if code != 0:
        raise SystemExit(f"an evicted worker exited {code} (SIGTERM should end it with 0)")
    wait_workers(cluster, test_pod, tls, 2, "after an eviction",
                 newer_than=(hosts[1], registered[hosts[1]]))

    # 7. helm test, then with quorum lost.
    for c, code, out in cluster.run_once(test_pod):
        if code != 0:
            raise SystemExit(f"helm test container {c} failed (exit {code}):\n{out}")
        print(f"helm test `{c}`: passed")
    for pod in sts_pods(coord)[1:]:
        cluster.stop_container(pod)
    results = cluster.run_once(test_pod)
    status = next(r for r in results if r[0] == "status")
    if status[1] not in (3, 4):
        raise SystemExit(f"helm test's status passed with 2 of 3 coordinators stopped (exit {status[1]}):\n{status[2]}")
    print(f"helm test with 2 of 3 coordinators stopped: `status` exits {status[1]}, helm test fails")


def renewals(cluster, pods, workdir):
    """Every pod's certificate renewed with a new key: each tessel process
    reports the new certificate's expiry within seconds (it adopted it)."""
    time.sleep(1.5)  # a renewal a second later expires a second later
    started = time.time()
    want = {}
    for pod, _ in pods:
        cluster.renew_certificates(pod)
        want[pod] = not_after(workdir / pod / "tls" / "node.pem")
    # The metrics port the chart gives its containers.
    port = next(p["containerPort"] for p in pods_ports(cluster, pods[0][0]) if p["name"] == "metrics")
    while True:
        seen = {pod: expiry(cluster, pod, port) for pod, _ in pods}
        if all(seen[p] == want[p] for p in want):
            break
        if time.time() - started > 20:
            raise SystemExit(f"renewed certificates not adopted in 20 s: reported {seen}, on disk {want}")
        time.sleep(0.5)
    print(f"every pod's certificate renewed (new keys): all {len(pods)} processes adopted theirs "
          f"in {time.time() - started:.1f} s, without a restart")


def pods_ports(cluster, pod):
    return cluster.pods[pod][0]["containers"][0]["ports"]


def expiry(cluster, pod, port):
    """`tessel_tls_certificate_expiry_seconds` from a pod's metrics, read
    on the pods' network."""
    url = f"http://{cluster.addrs[pod]}:{port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = re.search(r"^tessel_tls_certificate_expiry_seconds\{[^}]*\} (\S+)$", text, re.M)
    return int(float(m.group(1))) if m else None


def sts_pods(sts):
    return [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])]


def final_w(text):
    m = re.search(r"^final w (.*)$", text, re.M)
    if not m:
        raise SystemExit(f"no final weights in:\n{text}")
    return [float(x) for x in m.group(1).split()]


def worker_logs(cluster, workers):
    return "".join(cluster.logs(p)[0] for p in sts_pods(workers))


def wait_workers(cluster, test_pod, tls, n, what, newer_than=None, timeout=90):
    """Waits for `n` alive workers (and, with `newer_than` = (id, inc), for
    that worker at a later incarnation); returns {id: incarnation}."""
    deadline = time.time() + timeout
    while True:
        (_, code, out), = cluster.run_once(submitter(test_pod, "workers", ["workers", *tls]))
        alive = {l.split()[0]: int(l.split()[2]) for l in out.splitlines() if " alive " in l}
        again = newer_than is None or alive.get(newer_than[0], 0) > newer_than[1]
        if len(alive) >= n and again:
            print(f"{what}: {len(alive)} workers registered")
            return alive
        if time.time() > deadline:
            raise SystemExit(f"{what}: workers never registered:\n{out}")
        time.sleep(1)


workdir = Path(tempfile.mkdtemp(prefix="tessel-chart-"))
os.chmod(workdir, 0o755)
main(workdir)
