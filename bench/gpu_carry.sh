#!/usr/bin/env bash
# Builds .carry/ (git-ignored): what a GPU machine with NO network needs to run this project.
# That machine reaches no package registry and a device call carries at most 64 MiB, so we carry:
#   site.tar.xz  trimmed site-packages for CPython 3.12 / manylinux x86_64: ray 2.60.0 + the deps it lacks
#   liger_kernel-0.8.5-py3-none-any.whl, cache/<tiny model>, setup.sh (the unpack side)
# Run from the repo root: bash bench/gpu_carry.sh   (optional env: CARRY=.carry). Needs network, python3.12,
# strip, xz. Idempotent; leaves run.sh, CONTENTS.txt and other cache/ entries in place. Fails if $CARRY > 40 MiB.
# A device call then does, from the repo root:
#   source .carry/setup.sh     # unpacks to /tmp/site once; PYTHONPATH=/tmp/site:$PWD
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .carry/liger_kernel-*.whl
#   mkdir -p /tmp/cache && cp -r .carry/cache/. /tmp/cache/ && export SUBLIMINAL_CACHE=/tmp/cache
# Why: the machine has torch, transformers and peft but not Ray, pydantic, fastapi, uvicorn or jsonschema;
# opentelemetry-api (fastapi imports it) and grpcio-reflection (ray.serve does; 1.71.2 loads under any protobuf
# >= 5.29) come along. Ray's jars, rllib, llm, tests and web UI are not needed (tune is: Ray Train imports it).
# Measured use: BENCHMARKS.md, "The whole job and the throughput levers on one H200".
set -euo pipefail
CARRY=${CARRY:-.carry}
PINS=(ray==2.60.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
      fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 opentelemetry-api==1.45.2 grpcio-reflection==1.71.2
      jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1)
PLAT=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
PY312=""  # pip --target must run under 3.12 (bin/ scripts, tags); a pyenv shim may exist yet not work
for c in "${PY312_BIN:-}" python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
    if [ -n "$c" ] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then PY312=$c; break; fi
done
[ -n "$PY312" ] || { echo "gpu_carry: no working python3.12 found (set PY312_BIN=/path/to/python3.12)" >&2; exit 1; }
[ -x .venv/bin/python ] && [ -f jobs/sources/tiny_model.py ] || { echo "gpu_carry: run from the repo root (needs .venv)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/gpu_carry.XXXXXX); trap 'rm -rf "$WORK"' EXIT
S=$WORK/site; mkdir -p "$CARRY/cache" "$S"
python3 -m pip download -q "${PLAT[@]}" -d "$WORK/whl" "${PINS[@]}"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$WORK/liger" liger-kernel==0.8.5
"$PY312" -m pip install -q --no-index --no-deps --no-compile --target "$S" "$WORK"/whl/*.whl

# trims: jars/rllib/llm, tests/, __pycache__, the JS dashboard UI, symbol tables
rm -rf "$S/ray/jars" "$S/ray/rllib" "$S/ray/llm" "$S/ray/dashboard/client/build"
find "$S" -depth -type d \( -name tests -o -name __pycache__ \) -exec rm -rf {} +
mkdir -p "$S/ray/dashboard/client/build/static"
echo '<!doctype html><title>Ray</title><p>Ray dashboard UI not carried (trimmed); the REST API still works.</p>' \
    > "$S/ray/dashboard/client/build/index.html"
strip --strip-unneeded "$S/ray/_raylet.so" "$S/ray/core/src/ray/gcs/gcs_server" "$S/ray/core/src/ray/raylet/raylet"
sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$S"/bin/*

tar --sort=name --owner=0 --group=0 -C "$S" -cf - . | XZ_OPT="-9e -T1" xz > "$WORK/site.tar.xz"
mv "$WORK/site.tar.xz" "$CARRY/site.tar.xz"
rm -f "$CARRY"/liger_kernel-*.whl && cp "$WORK"/liger/liger_kernel-0.8.5-py3-none-any.whl "$CARRY/"
MODEL=$(.venv/bin/python -c "from jobs.sources.tiny_model import ensure_tiny_model; print(ensure_tiny_model())" | tail -n1)
[ -f "$MODEL/config.json" ] || { echo "gpu_carry: tiny model not found at '$MODEL'" >&2; exit 1; }
rm -rf "$CARRY/cache/$(basename "$MODEL")" && cp -r "$MODEL" "$CARRY/cache/"

cat > "$CARRY/setup.sh" <<'EOF'
# Usage (from the repo root on the target): source .carry/setup.sh
# Unpacks the carried site-packages (ray 2.60.0 + the deps the target lacks) into /tmp/site,
# only if /tmp/site/ray is not there yet, then puts /tmp/site and the repo first on PYTHONPATH.
# No network access; prints nothing secret.
_carry_dir="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
_carry_tar="$_carry_dir/site.tar.xz"
_carry_site=/tmp/site
if [ -d "$_carry_site/ray" ]; then
    echo "carry: $_carry_site/ray already present, not unpacking"
elif [ ! -f "$_carry_tar" ]; then
    echo "carry: $_carry_tar not found" >&2
else
    _carry_t0=$(date +%s.%N)
    if [ ! -e "$_carry_site" ]; then
        # unpack beside it, then rename: a half-done unpack never looks like a finished one
        _carry_tmp=$(mktemp -d /tmp/site.unpack.XXXXXX) && chmod 755 "$_carry_tmp"
        if tar -xJf "$_carry_tar" -C "$_carry_tmp" && mv "$_carry_tmp" "$_carry_site"; then _carry_ok=1; else _carry_ok=0; rm -rf "$_carry_tmp"; fi
    else
        if tar -xJf "$_carry_tar" -C "$_carry_site"; then _carry_ok=1; else _carry_ok=0; rm -rf "$_carry_site/ray"; fi
    fi
    _carry_t1=$(date +%s.%N)
    if [ "$_carry_ok" = 1 ]; then
        echo "carry: unpacked $(basename "$_carry_tar") into $_carry_site in $(awk -v a="$_carry_t0" -v b="$_carry_t1" 'BEGIN{printf "%.1f", b-a}') s"
    else
        echo "carry: unpacking $_carry_tar failed" >&2
    fi
fi
case ":${PYTHONPATH:-}:" in
    *":$_carry_site:$PWD:"*) ;;  # sourced before: already in front
    *) export PYTHONPATH="$_carry_site:$PWD${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
echo "carry: PYTHONPATH=$PYTHONPATH"
unset _carry_dir _carry_tar _carry_site _carry_t0 _carry_t1 _carry_tmp _carry_ok
EOF

echo "site-packages unpacked: $(du -sh "$S" | cut -f1)  ($(find "$S" | wc -l) entries)"
du -ab --max-depth=1 "$CARRY" | sort -n | awk '{printf "%12d  %s\n", $1, $2}'
total=$(du -sb "$CARRY" | cut -f1); limit=$((40 * 1024 * 1024))
[ "$total" -le "$limit" ] || { echo "gpu_carry: $CARRY is $total bytes > 40 MiB ($limit)" >&2; exit 1; }
echo "gpu_carry: OK, $CARRY = $total bytes ($(awk -v t="$total" 'BEGIN{printf "%.1f", t/1048576}') MiB <= 40 MiB)"
