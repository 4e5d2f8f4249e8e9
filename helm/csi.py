"""A strict imitation of cert-manager's csi-driver (csi.cert-manager.io)
with a CA Issuer, for helm/kubelet.py: a pod's inline `csi` volume gets a
key made for it and a certificate signed by the issuer's CA.

What it models, as csi-driver v0.10 with cert-manager's CA issuer does it:

* The volume must be readOnly, as csi-lib's node server demands
  ("pod.spec.volumes[].csi.readOnly must be set to 'true'").
* Attributes: issuer-name (required; the issuer must exist), issuer-kind
  (Issuer), issuer-group (cert-manager.io), common-name, dns-names,
  ip-sans, uri-sans (comma separated, blanks trimmed), duration (default
  2160h), key-usages (default "digital signature,key encipherment"; "server
  auth"/"client auth" become extended key usages), ca-file,
  certificate-file, privatekey-file (defaults ca.crt, tls.crt, tls.key),
  fs-group. Any other csi.cert-manager.io/ attribute is refused, not
  guessed.
* Variables in attribute values: $POD_NAME, ${POD_NAME}, and the same of
  POD_NAMESPACE, POD_UID and SERVICE_ACCOUNT_NAME; any other is an error
  ("undefined variable"), as the driver's is.
* Files: csi-lib's atomic writer: a timestamped folder, a `..data` link to
  it and one link per file, swapped by rename on renewal. Files are mode
  0440, owned by root and by the fs-group attribute's group (root's
  without it: the driver's CSIDriver declares no fsGroupPolicy, so the
  kubelet does not apply the pod's fsGroup to the volume).
* Renewal (`renew`): a new key and certificate, swapped in atomically.

What it does not model: approval (cert-manager's default approver approves
every request; approver-policy would gate them), other issuer types,
PKCS#12, key encodings and algorithms other than an ECDSA P-256 PKCS#8
key, renew-before timing (the harness calls `renew`).
"""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

DRIVER = "csi.cert-manager.io"
P = DRIVER + "/"
MODELLED = {"issuer-name", "issuer-kind", "issuer-group", "common-name", "dns-names", "ip-sans",
            "uri-sans", "duration", "key-usages", "ca-file", "certificate-file", "privatekey-file",
            "fs-group"}
EXTENDED = {"server auth": "serverAuth", "client auth": "clientAuth"}
BASIC = {"digital signature": "digitalSignature", "key encipherment": "keyEncipherment"}


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"csi imitation: {' '.join(args)} failed:\n{r.stdout}{r.stderr}")


def expand(value, variables):
    """$VAR and ${VAR} from `variables`; any other is an error."""
    undefined = []

    def sub(m):
        name = m.group(1) or m.group(2)
        if name not in variables:
            undefined.append(name)
            return ""
        return variables[name]
    out = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", sub, value)
    if undefined:
        raise SystemExit(f"csi imitation: undefined variable(s) {undefined}, known variables: {sorted(variables)}")
    return out


def csv(value):
    return [v.strip() for v in value.split(",") if v.strip()]


class CsiDriver:
    """`issuers`: Issuer name -> a folder with the CA's ca.pem and ca.key
    (what cert-manager holds in the CA Issuer's Secret)."""

    def __init__(self, issuers):
        self.issuers = {k: Path(v) for k, v in issuers.items()}
        self.volumes = {}  # folder -> (attributes expanded, file names)

    def publish(self, d, vol, pod, namespace, uid, service_account):
        csi = vol["csi"]
        if csi.get("driver") != DRIVER:
            raise SystemExit(f"kubelet imitation: CSI driver {csi.get('driver')} is not modelled")
        if csi.get("readOnly") is not True:
            raise SystemExit(f"pod {pod}: pod.spec.volumes[].csi.readOnly must be set to 'true' "
                             "(the csi-driver refuses the volume)")
        attrs = csi.get("volumeAttributes", {})
        unknown = [k for k in attrs if not k.startswith(P) or k[len(P):] not in MODELLED]
        if unknown:
            raise SystemExit(f"csi imitation: attributes {unknown} are not modelled")
        variables = {"POD_NAME": pod, "POD_NAMESPACE": namespace, "POD_UID": uid,
                     "SERVICE_ACCOUNT_NAME": service_account}
        a = {k[len(P):]: expand(str(v), variables) for k, v in attrs.items()}
        if a.get("issuer-kind", "Issuer") != "Issuer" or a.get("issuer-group", "cert-manager.io") != "cert-manager.io":
            raise SystemExit(f"csi imitation: issuer {a.get('issuer-kind')}/{a.get('issuer-group')} is not modelled")
        if a.get("issuer-name") not in self.issuers:
            raise SystemExit(f"csi imitation: issuer {a.get('issuer-name')!r} does not exist "
                             f"(the pod would stay ContainerCreating)")
        self.volumes[d] = a
        self.write(d, a)

    def renew(self, d):
        """What the driver does at renew-before: a new key and certificate."""
        self.write(d, self.volumes[d])

    def write(self, d, a):
        ca = self.issuers[a["issuer-name"]]
        work = d.parent / f".{d.name}-issue"
        shutil.rmtree(work, ignore_errors=True)
        work.parent.mkdir(parents=True, exist_ok=True)
        work.mkdir(mode=0o700)
        key, csr, crt, ext = (work / n for n in ("key.pem", "csr.pem", "crt.pem", "ext.cnf"))
        run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key))
        cn = a.get("common-name", "")
        run("openssl", "req", "-new", "-key", str(key), "-subj", f"/CN={cn}" if cn else "/", "-out", str(csr))
        sans = ([f"DNS:{n}" for n in csv(a.get("dns-names", ""))] + [f"IP:{n}" for n in csv(a.get("ip-sans", ""))]
                + [f"URI:{n}" for n in csv(a.get("uri-sans", ""))])
        usages = csv(a.get("key-usages", "digital signature,key encipherment"))
        bad = [u for u in usages if u not in BASIC and u not in EXTENDED]
        if bad:
            raise SystemExit(f"csi imitation: key usages {bad} are not modelled")
        lines = ["basicConstraints = CA:FALSE"]
        if sans:
            lines.append("subjectAltName = " + ",".join(sans))
        if any(u in BASIC for u in usages):
            lines.append("keyUsage = critical," + ",".join(BASIC[u] for u in usages if u in BASIC))
        if any(u in EXTENDED for u in usages):
            lines.append("extendedKeyUsage = " + ",".join(EXTENDED[u] for u in usages if u in EXTENDED))
        ext.write_text("\n".join(lines) + "\n")
        m = re.fullmatch(r"(\d+)h", a.get("duration", "2160h"))
        if not m:
            raise SystemExit(f"csi imitation: duration {a.get('duration')} is not modelled (hours only)")
        days = max(1, int(m.group(1)) // 24)
        run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca / "ca.pem"), "-CAkey", str(ca / "ca.key"),
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", str(days),
            "-extfile", str(ext), "-out", str(crt))
        files = {a.get("ca-file", "ca.crt"): (ca / "ca.pem").read_bytes(),
                 a.get("certificate-file", "tls.crt"): crt.read_bytes(),
                 a.get("privatekey-file", "tls.key"): key.read_bytes()}
        shutil.rmtree(work)
        group = int(a["fs-group"]) if "fs-group" in a else 0
        atomic_write(d, files, group)


def atomic_write(d, files, group):
    """csi-lib's atomic writer: a new timestamped folder, `..data` swapped
    to it by rename, one link per file."""
    d.mkdir(parents=True, exist_ok=True)
    os.chown(d, 0, group)
    os.chmod(d, 0o755)
    ts = d / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    ts.mkdir(mode=0o755)
    os.chown(ts, 0, group)
    for name, data in files.items():
        f = ts / name
        f.write_bytes(data)
        os.chown(f, 0, group)
        os.chmod(f, 0o440)
    tmp = d / "..data_tmp"
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(ts.name, tmp)
    old = os.readlink(d / "..data") if (d / "..data").is_symlink() else None
    os.rename(tmp, d / "..data")
    for name in files:
        link = d / name
        if not link.is_symlink():
            os.symlink(f"..data/{name}", link)
    if old:
        shutil.rmtree(d / old, ignore_errors=True)
