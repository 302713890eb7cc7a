# Sourced: finds cuDNN 9 headers for the build's cuDNN attention path (exports CUDNN_ROOT, pass it as
# -DCUDNN_ROOT) and keeps header and library of one install together: when the headers come from a
# Python wheel (nvidia-cudnn-cu13 in the torch venv), its lib goes first on LD_LIBRARY_PATH (libcudnn
# is dlopen'ed at run time). Without cuDNN headers the engine builds its own attention only.
if [ -z "${CUDNN_ROOT:-}" ]; then
  for dir in /usr/local/cuda /usr; do
    if [ -f "$dir/include/cudnn.h" ]; then CUDNN_ROOT=$dir; break; fi
  done
fi
if [ -z "${CUDNN_ROOT:-}" ]; then
  header=$(find / -xdev -path '*nvidia/cudnn/include/cudnn.h' 2>/dev/null | head -1)
  if [ -n "$header" ]; then
    CUDNN_ROOT=$(dirname "$(dirname "$header")")
    export LD_LIBRARY_PATH="$CUDNN_ROOT/lib:${LD_LIBRARY_PATH:-}"
  fi
fi
export CUDNN_ROOT
echo "cuDNN root: ${CUDNN_ROOT:-none} ($(cat "${CUDNN_ROOT:-/nonexistent}"/include/cudnn_version*.h 2>/dev/null | grep -m2 -E "define CUDNN_(MAJOR|MINOR) " | awk "{print \$3}" | paste -sd. -))"
