# Sourced on the GPU machine: puts the binaries of .xfer/pre-NAME (scripts/prebuild.sh) back where they
# were built, links the source tree they were built from (fixtures), and sets the NCCL / cuDNN / CUDA
# environment. Exports PREBUILT (the build directory).
#   source scripts/use_prebuilt.sh NAME [SOURCE-TREE]     (default: this checkout; a helper's .xfer/<name>)
pre_name=${1:?usage: source scripts/use_prebuilt.sh NAME [SOURCE-TREE]}
pre_dir=$PWD/.xfer/pre-$pre_name
pre_tree=$(cd "${2:-.}" && pwd)
if [ ! -f "$pre_dir/PATHS" ]; then
  echo "use_prebuilt: $pre_dir/PATHS missing (carry .xfer/pre-$pre_name)" >&2
  return 1
fi
PREBUILT=$(sed -n 's/^build_dir=//p' "$pre_dir/PATHS")
pre_source=$(sed -n 's/^source_dir=//p' "$pre_dir/PATHS")
rm -rf "$PREBUILT" && mkdir -p "$(dirname "$PREBUILT")" && cp -r "$pre_dir" "$PREBUILT"
if [ "$pre_source" != "$pre_tree" ] && [ ! -e "$pre_source" ]; then
  mkdir -p "$(dirname "$pre_source")" && ln -s "$pre_tree" "$pre_source"
fi
export PREBUILT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/nccl_env.sh
source scripts/cudnn_env.sh
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:/usr/local/cuda/lib64"
echo "prebuilt: $PREBUILT ($(sed -n 's/^commit=//p' "$pre_dir/PATHS")), sources $pre_source -> $pre_tree"
