#!/usr/bin/env python3
"""The chart runs: renders helm/tessel (CPU values, small sizes) and starts
its pods as containers of the image on a private Docker network, each with
the rendered args and environment (downward-API fields filled in with that
pod's name, namespace and index), the rendered TLS Secret's keys mounted as
files at the rendered paths, and the hostname and DNS names the rendered
Services would give it; then submits the MLP demo from a submitter pod and
sees it succeed, and runs the `helm test` pod's commands against the
cluster. Kubernetes itself cannot run here: this proves the chart's wiring
with the real binary, short of a cluster.

Usage: helm/run_chart.py HELM IMAGE (a Python with PyYAML). Removes every
container, network and folder it made, however it ends.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HELM, IMAGE = sys.argv[1], sys.argv[2]
REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "tessel"
NS = "ml"
TAG = f"tesselchart{os.getpid()}"
image_repo, image_tag = IMAGE.rsplit(":", 1)


def sh(*args, ok=True, **kw):
    r = subprocess.run(list(args), capture_output=True, text=True, **kw)
    if ok and r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return r


def render():
    out = sh(HELM, "template", "t", str(CHART), "-n", NS,
             "-f", str(CHART / "presets" / "cpu.yaml"),
             "--set", f"image.repository={image_repo}", "--set", f"image.tag={image_tag}",
             "--set", "workers.count=2", "--set", "workers.shmSize=256Mi").stdout
    return [o for o in yaml.safe_load_all(out) if o]


def fill_env(container, pod, index):
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            env[e["name"]] = {"metadata.name": pod, "metadata.namespace": NS}.get(
                path, str(index) if "job-completion-index" in path else "")
    return env


def run_pod(name, hostname, aliases, spec, extra_env, tls_dir, workdir):
    c = spec["containers"][0]
    args = ["docker", "run", "-d", "--name", f"{TAG}-{name}", "--network", TAG, "--init",
            "--hostname", hostname, "--shm-size", "256m"]
    for a in aliases:
        args += ["--network-alias", a]
    for k, v in extra_env.items():
        args += ["-e", f"{k}={v}"]
    for m in c.get("volumeMounts", []):
        if m["name"] == "tls":
            args += ["-v", f"{tls_dir}:{m['mountPath']}:ro"]
        elif m["name"] in ("data", "tmp", "work"):
            d = workdir / name / m["name"]
            d.mkdir(parents=True, exist_ok=True)
            os.chown(d, 10001, 10001)
            args += ["-v", f"{d}:{m['mountPath']}"]
    args += [f"{c['image']}"] + c["args"]
    sh(*args)


def main(workdir):
    objs = render()
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    jobs = [o for o in objs if o["kind"] == "Job"]
    svcs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    test_pod = next(o for o in objs if o["kind"] == "Pod")
    # The Secret cert-manager would make: one certificate naming the
    # rendered Certificate's DNS names and addresses, keys as Secret items.
    cert = next(o for o in objs if o["kind"] == "Certificate" and not o["spec"].get("isCA"))
    hosts = cert["spec"]["dnsNames"] + cert["spec"]["ipAddresses"]
    raw = workdir / "certs"
    sh(str(REPO / "target/debug/tessel"), "certs", "init", str(raw), "--hosts", ",".join(hosts))
    tls = workdir / "tls"
    tls.mkdir()
    items = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls")["secret"]["items"]
    secret = {"ca.crt": raw / "ca.pem", "tls.crt": raw / "node.pem", "tls.key": raw / "node.key"}
    for it in items:
        shutil.copy(secret[it["key"]], tls / it["path"])
        os.chown(tls / it["path"], 10001, 10001)
    sh("docker", "network", "create", TAG)
    # Coordinators: StatefulSet pods NAME-i in the headless service.
    headless = sts["spec"]["serviceName"]
    client_svc = sts["metadata"]["name"]
    name = sts["metadata"]["name"]
    for i in range(sts["spec"]["replicas"]):
        pod = f"{name}-{i}"
        aliases = [f"{pod}.{headless}.{NS}.svc", f"{pod}.{headless}.{NS}.svc.cluster.local",
                   f"{client_svc}.{NS}.svc"]
        env = fill_env(sts["spec"]["template"]["spec"]["containers"][0], pod, i)
        env.update({"HOSTNAME": pod, "KUBERNETES_SERVICE_HOST": "10.96.0.1"})
        run_pod(pod, pod, aliases, sts["spec"]["template"]["spec"], env, tls, workdir)
    # Workers: Indexed Job pods JOB-i in the Job's subdomain.
    for job in jobs:
        spec = job["spec"]["template"]["spec"]
        for i in range(job["spec"]["completions"]):
            pod = f"{job['metadata']['name']}-{i}"
            env = fill_env(spec["containers"][0], pod, i)
            env.update({"JOB_COMPLETION_INDEX": str(i), "KUBERNETES_SERVICE_HOST": "10.96.0.1"})
            run_pod(pod, pod, [f"{pod}.{spec['subdomain']}.{NS}.svc"], spec, env, tls, workdir)
    coordinators = test_pod["spec"]["containers"][0]["args"][3]
    submit = ["docker", "run", "--rm", "--network", TAG, "-v", f"{tls}:/tls:ro",
              "-v", f"{REPO / 'examples/mlp-data-parallel'}:/job:ro", IMAGE]
    deadline = time.time() + 90
    while True:
        r = sh(*submit, "workers", "--coordinator", coordinators, "--tls-dir", "/tls", ok=False)
        if r.stdout.count(" alive ") >= 2:
            break
        if time.time() > deadline:
            logs = sh("docker", "logs", f"{TAG}-{name}-0", ok=False)
            raise SystemExit(f"workers never registered:\n{r.stdout}{r.stderr}\n{logs.stderr[-3000:]}")
        time.sleep(1)
    started = time.time()
    r = sh(*submit, "submit", "/job/job-2x2.toml", "--wait", "--coordinator", coordinators, "--tls-dir", "/tls", ok=False)
    if r.returncode != 0 or "Succeeded" not in r.stderr + r.stdout:
        raise SystemExit(f"the demo did not succeed:\n{r.stdout}{r.stderr}")
    print(f"chart pods: the MLP demo succeeded in {time.time() - started:.1f} s")
    for c in test_pod["spec"]["containers"]:
        r = sh(*submit, *c["args"], ok=False)
        if r.returncode != 0:
            raise SystemExit(f"helm test container {c['name']} failed:\n{r.stdout}{r.stderr}")
        print(f"helm test `{c['name']}`: passed")


workdir = Path(tempfile.mkdtemp(prefix="tessel-chart-"))
try:
    main(workdir)
finally:
    ids = sh("docker", "ps", "-aq", "--filter", f"name={TAG}-", ok=False).stdout.split()
    if ids:
        sh("docker", "rm", "-f", *ids, ok=False)
    sh("docker", "network", "rm", TAG, ok=False)
    shutil.rmtree(workdir, ignore_errors=True)
