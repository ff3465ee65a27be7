# Sourced (not run) by the device scripts in this folder, from the repository root:
#   . tools/device_setup.sh LOGDIR
# Sets the run's environment (unbuffered output, NVLink multicast off as the device README asks),
# installs the carried wheels from .whl/ into /tmp/site and the package itself, writing
# LOGDIR/install.log, and records the GPU, the software and the source commit in LOGDIR/env.txt;
# exits the calling script with status 2 if either install fails.
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
