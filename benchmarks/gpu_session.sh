#!/usr/bin/env bash
# The GPU check on a lent GPU machine (issue #29; /work/shared/GPU.md): run this first in a session that
# has a GPU. One device command runs at most 10 minutes and a session has 30 minutes of device time, and a
# machine idle for 30 s goes back bare, so the check runs in three parts, each one self-contained (wheels,
# data, measurement) and each writing its part under $OUT; the parts are merged here afterwards.
#
# Once, on the development machine, in the repository root (the wheels the GPU node lacks, GPU.md):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl zstandard==0.25.0 lmdb==3.0.0 mlperf-logging==4.1.68 crc32c==2.9.post0 tomli-w==1.2.0 ase==3.29.0 \
#     simplejpeg==1.9.0
#   (the versions of the project's .venv; where pip finds no wheel for a platform tag, add
#   --platform manylinux_2_N_x86_64 for the N it names. GPU.md: the first six were enough there on
#   2026-11-23; simplejpeg, the ResNet readers' strict JPEG decode, came after.)
# Then three device calls, each `run` with carry [".whl"] and timeout_s 600:
#   bash benchmarks/gpu_session.sh tests      # the GPU test files, counted, and the bf16 GEMM peak
#   bash benchmarks/gpu_session.sh hpc        # cosmoflow, deepcam, oc20 at NVIDIA's local batches
#   bash benchmarks/gpu_session.sh training   # every other registered workload (training suite, new ones)
# and, back here, with the three folders the calls returned (files_at):
#   bash benchmarks/gpu_session.sh merge DIR1 DIR2 DIR3   # -> benchmarks/results/gpu_check_<date>_<device>.txt/.json
# Do not bring the mpich or mpi4py wheels: the system Open MPI's mpiexec is the launcher there.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?usage: gpu_session.sh tests|hpc|training|merge DIR...}
out=${OUT:-benchmarks/results/gpu_parts}
py=${PYTHON:-python3}

if [ "$part" = merge ]; then
    shift
    [ "$#" -gt 0 ] || { echo "gpu_session.sh merge: name the folders the device calls returned" >&2; exit 2; }
    parts=()
    for d in "$@"; do parts+=("$d"/gpu_check_part-*.json); done
    dev=$("$py" -c "import json,re,sys; l=json.load(open(sys.argv[1]))['device_line']; m=re.match(r'# GPU (?:NVIDIA )?([A-Za-z0-9]+)', l); print(m.group(1).lower() if m else 'cpu')" "${parts[0]}")
    day=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1])).get('date', ''))" "${parts[0]}")
    exec "$py" -m benchmarks.gpu_check --merge "${parts[@]}" --out "benchmarks/results/gpu_check_${day:-$(date +%F)}_${dev}"
fi

case "$part" in
    tests|hpc|training) ;;
    *) echo "gpu_session.sh: unknown part '$part' (tests, hpc, training, merge)" >&2; exit 2 ;;
esac
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$out/nvidia-smi_$part.csv" 2>&1 || true
case "$part" in
    tests)    args=(--tests gpu --test-workers 4 --no-workloads --budget-s 420) ;;
    hpc)      args=(--tests none --workloads cosmoflow,deepcam,oc20 --seconds 5 --budget-s 500) ;;
    training) rest=$("$py" -c "from hpcbench import registry; print(','.join(n for n in registry.names() if n not in ('cosmoflow', 'deepcam', 'oc20')))")
              args=(--tests none --workloads "$rest" --seconds 5 --budget-s 500) ;;
esac
"$py" -m benchmarks.gpu_check "${args[@]}" --work /tmp/hpcbench-gpu-check --out "$out/gpu_check_part-$part" 2>&1 \
    | tee "$out/gpu_check_part-$part.log"
