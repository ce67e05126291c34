#!/usr/bin/env bash
# TEST DOUBLE — NOT Miniforge. Stands in for the Miniforge installer in molecule/conda, because no
# conda channel (and no github.com) is reachable from the test machines.
#
# Usage (as the real installer): fake-miniforge-installer.sh -b -p PREFIX
# It installs PREFIX/bin/conda, a fake that records every call in PREFIX/fake-conda-calls.log and
# understands only what roles/mpi_env calls:
#   conda env create --prefix ENV --file SPEC      make ENV (see below)
#   conda env update --prefix ENV --file SPEC --prune
#   conda list --json --prefix ENV                 the spec's packages, pins as versions, except what
#                                                  PREFIX/fake-channel.json holds ({"openmpi": "4.1.5"}):
#                                                  that version is what was installed
# ENV is a `python3 -m venv --system-site-packages` venv (bin/python -> the system python3, so the
# distro's python3-mpi4py is importable) with bin/mpirun, mpiexec, orterun, orted, ompi_info
# linked to the distro's Open MPI. What it can't show: a real solve, real conda packages, and
# the pinned Open MPI itself (`conda list` reports the pin; the binaries are the distro's).
set -euo pipefail

prefix=""
batch=0
while [ $# -gt 0 ]; do
  case "$1" in
    -b) batch=1 ;;
    -p) prefix="$2"; shift ;;
    -u) ;;
    *) echo "fake-miniforge-installer: unsupported argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$batch" = 1 ] || { echo "fake-miniforge-installer: only batch mode (-b) is faked" >&2; exit 2; }
[ -n "$prefix" ] || { echo "fake-miniforge-installer: -p PREFIX is required" >&2; exit 2; }

mkdir -p "$prefix/bin" "$prefix/conda-meta" "$prefix/envs"
echo "installer -b -p $prefix" >> "$prefix/fake-conda-calls.log"
echo "fake miniforge (tests/doubles/fake-miniforge-installer.sh)" > "$prefix/conda-meta/FAKE"

cat > "$prefix/bin/conda" <<'CONDA'
#!/usr/bin/env bash
# TEST DOUBLE — fake conda installed by tests/doubles/fake-miniforge-installer.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
echo "$*" >> "$root/fake-conda-calls.log"

env_prefix="" spec=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --prefix|-p) env_prefix="${args[$((i + 1))]}" ;;
    --file|-f) spec="${args[$((i + 1))]}" ;;
  esac
done

# The spec's dependencies as JSON records: "openmpi=4.1.6" -> {"name": "openmpi", "version": "4.1.6"}.
records() {
  /usr/bin/python3 - "$1" "$root" <<'PY'
import json, os, re, sys
deps, inside = [], False
# A fake channel: PREFIX/fake-channel.json ({"openmpi": "4.1.5"}) holds the only version of a package
# it names, and that version is installed whatever the spec pins (a mirror with another build).
channel_file = os.path.join(sys.argv[2], "fake-channel.json")
channel = json.load(open(channel_file)) if os.path.exists(channel_file) else {}
for line in open(sys.argv[1]):
    if re.match(r"^dependencies:", line):
        inside = True
        continue
    if inside:
        m = re.match(r"^\s+-\s+([A-Za-z0-9_.\-]+)\s*(?:(==|=|<|>|<=|>=)\s*([^\s#]+))?", line)
        if m:
            name, op, ver = m.groups()
            held = channel.get(name)
            deps.append({"name": name, "version": held or (ver if op in ("=", "==") else "0.0.0.fake"),
                         "channel": "fake-double", "base_url": "fake://double"})
        elif re.match(r"^\S", line):
            inside = False
print(json.dumps(deps, indent=1))
PY
}

make_env() {
  [ -n "$env_prefix" ] && [ -n "$spec" ] || { echo "fake conda: --prefix and --file are required" >&2; exit 2; }
  if [ ! -x "$env_prefix/bin/python" ]; then
    /usr/bin/python3 -m venv --system-site-packages "$env_prefix"
  fi
  for tool in mpirun mpiexec orterun orted ompi_info; do
    if [ -e "/usr/bin/$tool" ]; then ln -sfn "/usr/bin/$tool" "$env_prefix/bin/$tool"; fi
  done
  mkdir -p "$env_prefix/conda-meta"
  records "$spec" > "$env_prefix/conda-meta/fake-packages.json"
  echo "==> $(date -u +%FT%TZ) <== fake conda $*" >> "$env_prefix/conda-meta/history"
}

case "${1:-} ${2:-}" in
  "env create") make_env "$@" ;;
  "env update") [ -e "$env_prefix/conda-meta/history" ] || { echo "fake conda: no env at $env_prefix" >&2; exit 1; }; make_env "$@" ;;
  "list --json")
    if [ -e "$env_prefix/conda-meta/fake-packages.json" ]; then cat "$env_prefix/conda-meta/fake-packages.json"
    else echo "fake conda: no env at $env_prefix" >&2; exit 1; fi ;;
  *) echo "fake conda: '$*' is not faked" >&2; exit 2 ;;
esac
CONDA
chmod 0755 "$prefix/bin/conda"
echo "fake Miniforge installed to $prefix"
