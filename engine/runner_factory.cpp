// make_model_runner: the CPU or the GPU runner, as RunnerOptions::device asks.
#include <algorithm>
#include <cctype>

#include "engine/gpu_model.h"
#include "engine/model.h"
#include "megamoe/error.h"
#include "megamoe/moe.h"

namespace megamoe::engine {

std::string resolve_runner_device(const RunnerOptions& options) {
  std::string device = options.device;
  std::transform(device.begin(), device.end(), device.begin(), [](unsigned char c) { return std::tolower(c); });
  if (device == "gpu") device = "cuda";
  MEGAMOE_CHECK(device == "auto" || device == "cpu" || device == "cuda", "--device '", options.device,
                "' is not supported (auto, cpu, cuda)");
  if (device != "auto") return device;
  // NOTES: the reference backends run on the CPU; every other backend (staged, mega) needs a GPU.
  const std::string backend = normalize_backend_name(options.moe_backend);
  return backend.rfind("reference", 0) == 0 ? "cpu" : "cuda";
}

std::unique_ptr<ModelRunner> make_model_runner(const std::string& model_dir, const RunnerOptions& options) {
  if (resolve_runner_device(options) == "cpu") return make_cpu_model_runner(model_dir, options);
  return make_gpu_model_runner(model_dir, options);
}

#ifndef MEGAMOE_WITH_CUDA
bool gpu_runner_available(std::string* why) {
  if (why) *why = "built without CUDA (MEGAMOE_ENABLE_CUDA=OFF)";
  return false;
}
std::unique_ptr<ModelRunner> make_gpu_model_runner(const ModelConfig&, const std::string&, const RunnerOptions&) {
  MEGAMOE_FAIL("the GPU runner (--device cuda, or a GPU --moe-backend such as staged) needs a CUDA build (MEGAMOE_ENABLE_CUDA=OFF here)");
}
std::unique_ptr<ModelRunner> make_gpu_model_runner(const std::string&, const RunnerOptions&) {
  MEGAMOE_FAIL("the GPU runner (--device cuda, or a GPU --moe-backend such as staged) needs a CUDA build (MEGAMOE_ENABLE_CUDA=OFF here)");
}
#endif

}  // namespace megamoe::engine
