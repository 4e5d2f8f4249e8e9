"""A strict, small imitation of a kubelet and a cluster's DNS, for
helm/run_chart.py: the rendered chart's pods as Docker containers.

It must never fix up what a real cluster would not. What it models, as
Kubernetes 1.30+ does it:

* Pod identity: the container's host name is the pod's name; HOSTNAME is
  set from it; KUBERNETES_SERVICE_HOST/PORT are set (the API server's
  Service, always present), no other service variables (the chart sets
  enableServiceLinks: false).
* DNS: only what the cluster's DNS serves, from helm/dns.py on the
  network (answering NXDOMAIN for anything else, as CoreDNS does):
  `SVC.NS.svc.cluster.local` for a Service (the addresses of the running
  pods it selects), `POD.SUB.NS.svc.cluster.local` for a pod whose
  subdomain (StatefulSet serviceName) names a headless Service that
  selects it. Each pod's resolv.conf is the kubelet's (that server, search
  NS.svc.cluster.local svc.cluster.local cluster.local, ndots:5), so `SVC`,
  `SVC.NS.svc` and `POD.SUB` resolve as in a pod; its /etc/hosts names
  itself (short and full name) and nothing else. The Docker network is
  internal: nothing outside resolves or is reached. A pod gets a new
  address when it is created again.
* Environment: `value`, and `valueFrom.fieldRef` for metadata.name,
  metadata.namespace, metadata.uid, spec.nodeName, status.podIP and
  metadata.labels['…'] / metadata.annotations['…']; any other source is
  refused (not guessed). `$(VAR)` in command and args is expanded from the
  container's variables defined before it, `$$` escapes, unknown
  references stay as written, as the kubelet does.
* Security context: runAsUser/runAsGroup (`--user`), fsGroup as a
  supplementary group, readOnlyRootFilesystem (`--read-only`),
  capabilities drop ALL (`--cap-drop ALL`), allowPrivilegeEscalation false
  (no-new-privileges), seccomp RuntimeDefault (Docker's default profile).
  The image's USER is overridden only where runAsUser is given.
* Volumes: a Secret's items as files owned by root with the item's mode or
  the volume's defaultMode (0644 when unset); with fsGroup the kubelet
  gives them that group and adds group read (0440), and nothing else. An
  emptyDir is a root-owned folder of mode 0777 (with fsGroup: its group
  and setgid); medium Memory is a tmpfs of its sizeLimit. A
  volumeClaimTemplate's volume is a root-owned 0755 folder (a fresh
  disk), made group-writable for fsGroup as the kubelet does. Mounts with
  readOnly are read-only. An inline `csi` volume of cert-manager's
  csi-driver is helm/csi.py's (its docstring says what it models); any
  other CSI driver is refused.
* Lifecycle: init containers run in order, each to exit 0, before the
  containers start; a container is PID 1 of its own PID namespace (no
  init process is added). Deleting a pod sends SIGTERM, waits
  terminationGracePeriodSeconds (30 when unset), then SIGKILL.
  restartPolicy Always restarts a container in place whatever its exit
  code (Docker's restart policy `always`); Never does not.
* Controllers: a StatefulSet's pods NAME-0..N-1 (podManagementPolicy
  Parallel: all at once), recreated under the same name when deleted or
  evicted; a bare Pod is run once. Other kinds that own pods (Job,
  Deployment, DaemonSet) are refused: their semantics are not modelled.

What it does not model: the scheduler (node selectors, affinity,
tolerations: no nodes), resource requests and limits, probes (readiness
does not gate DNS or Service membership here), NetworkPolicy, PDBs,
cert-manager's controller (the caller supplies Secrets' files and the CA
Issuers' CAs), image pulls.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from csi import CsiDriver

CLUSTER_DOMAIN = "cluster.local"
DEFAULT_GRACE = 30


def sh(*args, ok=True, **kw):
    r = subprocess.run(list(args), capture_output=True, text=True, **kw)
    if ok and r.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return r


def expand(text, env):
    """The kubelet's $(VAR) expansion: defined names are replaced, $$ is a
    literal $, anything else stays as written."""
    def sub(m):
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, text)


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


class Cluster:
    """One namespace on one Docker network."""

    def __init__(self, tag, namespace, workdir, secrets, subnet, dns_image, issuers=None):
        """`secrets`: Secret name -> {key: bytes} (what cert-manager or an
        admin would have created); `issuers`: CA Issuer name -> a folder
        with its ca.pem and ca.key (for csi volumes); `subnet`: the network's first three
        octets (pods get .10-.127, one-off pods Docker's pick from .128 up);
        `dns_image`: any image with python3, to run the cluster's DNS."""
        self.tag, self.ns, self.workdir, self.secrets = tag, namespace, Path(workdir), secrets
        self.csi = CsiDriver(issuers or {})
        self.subnet, self.next_ip = subnet, 10
        self.services = []
        self.pods = {}  # name -> (spec, labels, subdomain, claims, restart)
        self.addrs = {}  # pod -> its address
        self.workdir.mkdir(parents=True, exist_ok=True)
        # A folder, not a file, is mounted: records are replaced by rename.
        (self.workdir / "dns").mkdir(mode=0o755)
        self.records = self.workdir / "dns" / "records.json"
        self.records.write_text("{}")
        os.chmod(self.records, 0o644)
        self.resolv = self.workdir / "resolv.conf"
        self.resolv.write_text(f"nameserver {subnet}.2\nsearch {namespace}.svc.{CLUSTER_DOMAIN} "
                               f"svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\noptions ndots:5\n")
        os.chmod(self.resolv, 0o644)
        sh("docker", "network", "create", "--internal", "--subnet", f"{subnet}.0/24",
           "--ip-range", f"{subnet}.128/25", tag)
        here = Path(__file__).resolve().parent
        sh("docker", "run", "-d", "--name", f"{tag}-dns", "--network", tag, "--ip", f"{subnet}.2",
           "--user", "0", "--mount", f"type=bind,src={here / 'dns.py'},dst=/dns.py,readonly",
           "--mount", f"type=bind,src={self.records.parent},dst=/dns,readonly",
           dns_image, "python3", "/dns.py", "/dns/records.json")

    # -- objects -------------------------------------------------------
    def apply(self, objs):
        kinds = {"Service", "StatefulSet", "Pod"}
        ignored = {"Certificate", "Issuer", "NetworkPolicy", "PodDisruptionBudget",
                   "ServiceMonitor", "Secret"}
        for o in objs:
            if o["kind"] not in kinds | ignored:
                raise SystemExit(f"kubelet imitation: {o['kind']} is not modelled")
        self.services = [o for o in objs if o["kind"] == "Service"]
        self.statefulsets = [o for o in objs if o["kind"] == "StatefulSet"]

    def statefulset_pods(self, sts):
        name = sts["metadata"]["name"]
        return [f"{name}-{i}" for i in range(sts["spec"]["replicas"])]

    def start_statefulset(self, sts):
        for pod in self.statefulset_pods(sts):
            self.start_statefulset_pod(sts, pod)

    def start_statefulset_pod(self, sts, pod):
        tpl = sts["spec"]["template"]
        labels = dict(tpl["metadata"].get("labels", {}))
        ordinal = pod.rsplit("-", 1)[1]
        labels["statefulset.kubernetes.io/pod-name"] = pod
        labels["apps.kubernetes.io/pod-index"] = ordinal
        claims = [c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])]
        self.run_pod(pod, tpl["spec"], labels, subdomain=sts["spec"]["serviceName"],
                     claims=claims, restart="always")

    # -- pods ------------------------------------------------------------
    def publish_dns(self):
        """The cluster's records from the running pods (the DNS server
        rereads the file)."""
        records = {}
        for pod, (spec, labels, subdomain, _, _) in self.pods.items():
            ip = self.addrs[pod]
            for svc in self.services:
                sspec, sname = svc["spec"], svc["metadata"]["name"]
                if not selects(sspec.get("selector"), labels):
                    continue
                records.setdefault(f"{sname}.{self.ns}.svc.{CLUSTER_DOMAIN}", []).append(ip)
                if sspec.get("clusterIP") == "None" and subdomain == sname:
                    records[f"{pod}.{sname}.{self.ns}.svc.{CLUSTER_DOMAIN}"] = [ip]
        tmp = self.records.with_suffix(".tmp")
        tmp.write_text(json.dumps(records))
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.records)

    def allocate(self):
        if self.next_ip > 127:
            raise SystemExit("kubelet imitation: out of pod addresses")
        self.next_ip += 1
        return f"{self.subnet}.{self.next_ip - 1}"

    def field(self, path, pod, labels, annotations):
        fixed = {"metadata.name": pod, "metadata.namespace": self.ns,
                 "metadata.uid": f"uid-{pod}", "spec.nodeName": "node-0"}
        if path in fixed:
            return fixed[path]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            src = labels if m.group(1) == "labels" else annotations
            if m.group(2) not in src:
                raise SystemExit(f"kubelet imitation: {path} is not set on pod {pod}")
            return src[m.group(2)]
        raise SystemExit(f"kubelet imitation: fieldRef {path} is not modelled")

    def env_of(self, c, pod, labels, annotations):
        env = {}
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = expand(e["value"], env)
            elif "fieldRef" in e.get("valueFrom", {}):
                env[e["name"]] = self.field(e["valueFrom"]["fieldRef"]["fieldPath"], pod,
                                            labels, annotations)
            else:
                raise SystemExit(f"kubelet imitation: env source {e} is not modelled")
        return env

    def volume_dir(self, pod, vol, fs_group, claims, service_account):
        d = self.workdir / pod / vol["name"]
        if d.exists():
            return d  # a restarted container keeps its pod's volumes
        if "csi" in vol:
            self.csi.publish(d, vol, pod, self.ns, f"uid-{pod}", service_account)
            return d
        d.mkdir(parents=True)
        os.chown(d, 0, 0)
        if "secret" in vol:
            s = vol["secret"]
            data = self.secrets[s["secretName"]]
            default = s.get("defaultMode", 0o644)
            items = s.get("items") or [{"key": k, "path": k} for k in data]
            for it in items:
                f = d / it["path"]
                f.write_bytes(data[it["key"]])
                os.chown(f, 0, fs_group if fs_group is not None else 0)
                mode = it.get("mode", default)
                os.chmod(f, mode | (0o440 if fs_group is not None else 0))
            os.chmod(d, 0o755)
            if fs_group is not None:
                os.chown(d, 0, fs_group)
                os.chmod(d, 0o755 | 0o2000 | 0o050)
        elif "emptyDir" in vol or vol["name"] in claims:
            fresh_disk = vol["name"] in claims
            os.chmod(d, 0o755 if fresh_disk else 0o777)
            if fs_group is not None:
                os.chown(d, 0, fs_group)
                os.chmod(d, (0o755 if fresh_disk else 0o777) | 0o2070)
        else:
            raise SystemExit(f"kubelet imitation: volume {vol} is not modelled")
        return d

    def mounts(self, pod, c, volumes, fs_group, claims, service_account):
        args = []
        for m in c.get("volumeMounts", []):
            vol = volumes.get(m["name"]) or ({"name": m["name"]} if m["name"] in claims else None)
            if vol is None:
                raise SystemExit(f"pod {pod}: mount of unknown volume {m['name']}")
            ro = ",readonly" if m.get("readOnly") else ""
            if vol.get("emptyDir", {}).get("medium") == "Memory":
                size = vol["emptyDir"].get("sizeLimit", "64Mi")
                args += ["--mount", f"type=tmpfs,dst={m['mountPath']},tmpfs-size={to_bytes(size)},tmpfs-mode=1777"]
                continue
            d = self.volume_dir(pod, vol, fs_group, claims, service_account)
            args += ["--mount", f"type=bind,src={d},dst={m['mountPath']}{ro}"]
        return args

    def security(self, pod, pod_sc, c):
        sc = {**{k: v for k, v in pod_sc.items() if k in ("runAsUser", "runAsGroup", "runAsNonRoot")},
              **c.get("securityContext", {})}
        if sc.get("runAsNonRoot") and "runAsUser" not in sc:
            user = sh("docker", "image", "inspect", "-f", "{{.Config.User}}", c["image"]).stdout.strip()
            if user.split(":")[0] in ("", "root", "0"):
                raise SystemExit(f"pod {pod}: container {c['name']} has runAsNonRoot and would run as root "
                                 "(the kubelet refuses it: CreateContainerConfigError)")
        args = []
        if "runAsUser" in sc:
            args += ["--user", f"{sc['runAsUser']}:{sc.get('runAsGroup', 0)}"]
        if "fsGroup" in pod_sc:
            args += ["--group-add", str(pod_sc["fsGroup"])]
        if sc.get("readOnlyRootFilesystem"):
            args.append("--read-only")
        if "ALL" in sc.get("capabilities", {}).get("drop", []):
            args += ["--cap-drop", "ALL"]
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        prof = pod_sc.get("seccompProfile", sc.get("seccompProfile", {})).get("type")
        if prof not in (None, "RuntimeDefault"):
            raise SystemExit(f"kubelet imitation: seccomp {prof} is not modelled")
        return args

    def docker_args(self, pod, spec, c, env, ip, fs_group, claims, extra=(), subdomain=None):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        args = ["--network", self.tag, "--hostname", pod,
                "--mount", f"type=bind,src={self.resolv},dst=/etc/resolv.conf,readonly"]
        if ip:
            args += ["--ip", ip]
            if subdomain:
                args += ["--add-host", f"{pod}.{subdomain}.{self.ns}.svc.{CLUSTER_DOMAIN}:{ip}"]
        args += ["-e", "KUBERNETES_SERVICE_HOST=10.96.0.1", "-e", "KUBERNETES_SERVICE_PORT=443"]
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        args += self.security(pod, spec.get("securityContext", {}), c)
        args += self.mounts(pod, c, volumes, fs_group, claims, spec.get("serviceAccountName", "default"))
        args += list(extra)
        if "command" in c:
            args += ["--entrypoint", expand(c["command"][0], env)]
        args.append(c["image"])
        args += [expand(a, env) for a in c.get("command", [])[1:] + c.get("args", [])]
        return args

    def run_pod(self, pod, spec, labels, subdomain=None, claims=(), restart="no", annotations=None):
        """Starts a pod: init containers to completion, then its first
        container. Returns the container's name."""
        annotations = annotations or {}
        fs_group = spec.get("securityContext", {}).get("fsGroup")
        ip = self.allocate()
        for i, c in enumerate(spec.get("initContainers", [])):
            env = self.env_of(c, pod, labels, annotations)
            r = sh("docker", "run", "--rm", "--name", f"{self.tag}-{pod}-init{i}",
                   *self.docker_args(pod, spec, c, env, None, fs_group, claims), ok=False)
            if r.returncode != 0:
                raise SystemExit(f"pod {pod}: init container {c['name']} exited {r.returncode}:\n{r.stdout}{r.stderr}")
        c = spec["containers"][0]
        env = self.env_of(c, pod, labels, annotations)
        name = f"{self.tag}-{pod}"
        sh("docker", "run", "-d", "--name", name, "--restart", restart,
           "--stop-timeout", str(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE)),
           *self.docker_args(pod, spec, c, env, ip, fs_group, claims, subdomain=subdomain))
        self.pods[pod] = (spec, labels, subdomain, claims, restart)
        self.addrs[pod] = ip
        self.publish_dns()
        return name

    def run_once(self, pod_obj, extra_args=()):
        """A bare Pod with restartPolicy Never whose containers run in
        order (as `helm test` runs the test pod's): [(name, exit, output)].
        `extra_args` are Docker options for every container (the harness's
        own way to hand a submitter its job folder, as a ConfigMap would)."""
        spec = pod_obj["spec"]
        pod = pod_obj["metadata"]["name"]
        labels = pod_obj["metadata"].get("labels", {})
        fs_group = spec.get("securityContext", {}).get("fsGroup")
        out = []
        for c in spec["containers"]:
            env = self.env_of(c, pod, labels, {})
            r = sh("docker", "run", "--rm", "--name", f"{self.tag}-{pod}-{c['name']}",
                   *self.docker_args(pod, spec, c, env, None, fs_group, (), extra_args), ok=False)
            out.append((c["name"], r.returncode, r.stdout + r.stderr))
        shutil.rmtree(self.workdir / pod, ignore_errors=True)
        return out

    def delete_pod(self, pod):
        """SIGTERM, the grace period, SIGKILL; returns the exit code."""
        name = f"{self.tag}-{pod}"
        spec = self.pods[pod][0]
        grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE)
        sh("docker", "stop", "-t", str(grace), name)
        code = int(sh("docker", "inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip())
        sh("docker", "rm", name)
        shutil.rmtree(self.workdir / pod, ignore_errors=True)
        del self.pods[pod], self.addrs[pod]
        self.publish_dns()
        return code

    def evict_and_replace(self, sts, pod):
        """What the kubelet and the StatefulSet controller do to an evicted
        pod: delete it (SIGTERM, grace, SIGKILL), then create it again
        under the same name. Returns the old container's exit code."""
        code = self.delete_pod(pod)
        self.start_statefulset_pod(sts, pod)
        return code

    def renew_certificates(self, pod):
        """What the csi-driver does at renewal time to every csi volume of
        a running pod: a new key and certificate, swapped in atomically."""
        for d in list(self.csi.volumes):
            if d.parent == self.workdir / pod and d.exists():
                self.csi.renew(d)

    def stop_container(self, pod):
        """A pod whose node is gone: its container stops and nothing
        replaces it; its DNS records stay (the Endpoints lag)."""
        sh("docker", "update", "--restart", "no", f"{self.tag}-{pod}")
        sh("docker", "stop", f"{self.tag}-{pod}")

    def logs(self, pod):
        r = sh("docker", "logs", f"{self.tag}-{pod}", ok=False)
        return r.stdout, r.stderr

    def exec(self, pod, *cmd):
        return sh("docker", "exec", f"{self.tag}-{pod}", *cmd, ok=False)

    def cleanup(self):
        ids = sh("docker", "ps", "-aq", "--filter", f"name={self.tag}-", ok=False).stdout.split()
        if ids:
            sh("docker", "rm", "-f", *ids, ok=False)
        sh("docker", "network", "rm", self.tag, ok=False)
        shutil.rmtree(self.workdir, ignore_errors=True)


def to_bytes(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", q)
    if not m:
        raise SystemExit(f"quantity {q} is not modelled")
    return int(m.group(1)) * {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[m.group(2)]
