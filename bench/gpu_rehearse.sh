#!/usr/bin/env bash
# Rehearse the one device call here, on the CPU (issue #36):
#
#   bash bench/gpu_rehearse.sh [OUT_DIR] [--steps env,soaks]   # OUT_DIR: a new temp folder if left out
#
# 1. A virtual environment holding only packages the device image has (bench/gpu/image_packages.txt;
#    CPU builds: torch 2.13.0+cpu here, 2.11.0+cu130 there; this host's Python, 3.11 here, 3.12
#    there), kept in $SOAKD_REHEARSE_VENV (default ~/.cache/soakd/rehearse-venv) and rebuilt when
#    what it should hold changes. Any package in it that the image lacks stops the rehearsal.
# 2. The wheels the device call carries, fetched by bench/gpu_wheels.sh into .whl/.
# 3. bench/gpu_check.sh with that venv's python3 as the image's python3 (the checkout's .venv not
#    tried, .whl installed into a site folder of its own) and SOAKD_GPU_REHEARSE=1: every step
#    runs its soakd commands for real on the CPU, at a small shape, for seconds.
#
# So a wheel the device lacks, or a module-level import of a package the image does not have,
# fails here (CI runs this: .ci/run) and not in the 15 minutes of a device call. About a minute
# and a half with the venv built (a first build adds under a minute with torch on local disk).
# Exit status: gpu_check.sh's (0 every step passed), or 1 when the venv cannot be made as the image.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then
  out=$1
  shift
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/soakd-rehearse-out.XXXXXX")
fi
venv=${SOAKD_REHEARSE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/soakd/rehearse-venv}
PY=${PYTHON:-python3}
image=bench/gpu/image_packages.txt
# What the steps need from the image (soakd's own dependencies that the image has, and pytest);
# pip brings their dependencies, each of which must be in the image too. python-dateutil below 3:
# 3.0 and 4.0 require tzdata, which the image's list does not hold, so its dateutil is older.
need=(torch==2.13.0 numpy scipy pillow matplotlib 'python-dateutil<3' psutil prometheus-client nvidia-ml-py pytest)

norm() { tr '[:upper:]_.' '[:lower:]--'; }
in_image() { grep -v '^#' "$image" | norm | grep -qx "$(printf '%s' "$1" | norm)"; }

for spec in "${need[@]}"; do
  if ! in_image "${spec%%[=<>]*}"; then
    echo "gpu_rehearse: ${spec%%[=<>]*} is not in the device image ($image): carry it as a wheel instead" >&2
    exit 1
  fi
done

stamp="$("$PY" -c 'import sys; print(sys.version)') ${need[*]}"
if [ ! -x "$venv/bin/python3" ] || [ "$(cat "$venv/.rehearse-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "gpu_rehearse: building $venv (image packages only: ${need[*]})"
  rm -rf "$venv"
  "$PY" -m venv "$venv"
  # No byte-compiling (torch's .py files alone take a minute of it); pip's chatter to a log.
  if ! "$venv/bin/python3" -m pip install -q --no-compile "${need[@]}" >"$venv/pip.log" 2>&1; then
    cat "$venv/pip.log" >&2
    exit 1
  fi
  printf '%s' "$stamp" >"$venv/.rehearse-stamp"
fi
extra=()
while read -r dist; do
  case $dist in pip | setuptools | wheel) continue ;; esac
  in_image "$dist" || extra+=("$dist")
done < <("$venv/bin/python3" -m pip list --format=freeze 2>/dev/null | sed 's/==.*//')
if [ ${#extra[@]} -gt 0 ]; then
  echo "gpu_rehearse: the venv holds packages the device image lacks: ${extra[*]} (rm -rf $venv; check $image)" >&2
  exit 1
fi

bash bench/gpu_wheels.sh >/dev/null 2>"$out.wheels.log" || { cat "$out.wheels.log" >&2; exit 1; }
rm -f "$out.wheels.log"
site=$(mktemp -d "${TMPDIR:-/tmp}/soakd-rehearse-site.XXXXXX")
trap 'rm -rf "$site"' EXIT
echo "gpu_rehearse: bench/gpu_check.sh $out on the CPU, python3 = $venv/bin/python3"
set +e
env -u PYTHON -u PYTHONPATH -u VIRTUAL_ENV PATH="$venv/bin:$PATH" CUDA_VISIBLE_DEVICES="" \
  SOAKD_GPU_REHEARSE=1 SOAKD_SITE="$site" bash bench/gpu_check.sh "$out" "$@"
rc=$?
set -e
echo "gpu_rehearse: exit $rc; report in $out/gpu_check.md"
exit $rc
