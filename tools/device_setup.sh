# Sourced (not run) by the device scripts in this folder, from the repository root:
#   . tools/device_setup.sh LOGDIR
# Sets the run's environment (unbuffered output, NVLink multicast off as the device README asks),
# installs the carried wheels from .whl/ into /tmp/site and the package itself, writing
# LOGDIR/install.log, records the GPU, the software and the source commit in LOGDIR/env.txt, then builds
# the cuda_bf16 library (or finds it in the cache) and adds the build's time to env.txt, so the first
# step's timeout (e.g. the GPU tests') is not spent in nvcc (on 2026-12-07 a 100 s test step gave no
# result on a cold machine); exits the calling script with status 2 if either install fails.
export PYTHONUNBUFFERED=1 CI=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p "$1"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 2
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$1/install.log" 2>&1 || { cat "$1/install.log"; exit 2; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python3 -c "import transformers; print('transformers', transformers.__version__)" 2>/dev/null || echo "transformers: not installed"
  echo "commit ${RL_ENGINE_SOURCE_COMMIT:-unknown} dirty ${RL_ENGINE_SOURCE_DIRTY:-unknown}"; } > "$1/env.txt" 2>&1
python3 -c "from rl_engine.backends.cuda_build import build; r = build()
print('cuda_bf16 library:', 'from the cache' if r.cached else 'cold build', f'in {r.seconds:.1f} s')" >>"$1/env.txt" 2>&1 \
  || echo "cuda_bf16 library: the build failed (the log above)" >>"$1/env.txt"
