# Sourced: picks an NCCL whose header and library versions match (a mismatch segfaulted on the GPU
# machines). Prefers the torch venv's nvidia-nccl wheel (headers + lib of one version), then the
# system one. Exports MEGAMOE_NCCL_ROOT and puts its lib first on LD_LIBRARY_PATH.
if [ -z "${MEGAMOE_NCCL_ROOT:-}" ]; then
  wheel=$(python3 -c "import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null || true)
  # The torch venv may not be the default python3: look for the wheel's files directly.
  [ -n "$wheel" ] || wheel=$(dirname "$(dirname "$(find / -xdev -path '*nvidia/nccl/include/nccl.h' 2>/dev/null | head -1)")" 2>/dev/null || true)
  [ "$wheel" != . ] || wheel=""
  if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ] && ls "$wheel"/lib/libnccl.so* >/dev/null 2>&1; then
    MEGAMOE_NCCL_ROOT=$wheel
    [ -e "$wheel/lib/libnccl.so" ] || ln -sf "$(ls "$wheel"/lib/libnccl.so.* | head -1)" "$wheel/lib/libnccl.so" 2>/dev/null || true
  elif [ -f /usr/include/nccl.h ]; then
    MEGAMOE_NCCL_ROOT=/usr
  else
    MEGAMOE_NCCL_ROOT=/usr/local/cuda
  fi
fi
export MEGAMOE_NCCL_ROOT
export LD_LIBRARY_PATH="$MEGAMOE_NCCL_ROOT/lib:$MEGAMOE_NCCL_ROOT/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
echo "NCCL root: $MEGAMOE_NCCL_ROOT ($(grep -h '#define NCCL_VERSION_CODE' "$MEGAMOE_NCCL_ROOT"/include/nccl.h 2>/dev/null))"
