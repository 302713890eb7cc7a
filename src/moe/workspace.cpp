// MoeWorkspace (moe.h): the registry of regions MoE layers share. Plain C++: the regions themselves
// (device memory, EP windows) are made and freed by the backends' `create` callbacks and destructors.
#include <algorithm>

#include "megamoe/error.h"
#include "megamoe/moe.h"

namespace megamoe {

std::shared_ptr<MoeWorkspace::Shared> MoeWorkspace::acquire(const std::string& key,
                                                            const std::function<std::shared_ptr<Shared>()>& create) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [k, region] : regions_)
    if (k == key) return region;
  // NOTES: created under the lock, so two threads asking for one key get one region; `create` must
  // not call back into this workspace.
  std::shared_ptr<Shared> region = create();
  MEGAMOE_CHECK(region != nullptr, "MoeWorkspace::acquire: the region for '", key, "' was not created");
  regions_.emplace_back(key, region);
  return region;
}

std::vector<MoeWorkspace::Region> MoeWorkspace::regions() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Region> out;
  for (const auto& [key, region] : regions_)
    out.push_back(Region{key, region->device_bytes, region->symmetric_bytes, static_cast<int>(region.use_count()) - 1});
  return out;
}

size_t MoeWorkspace::device_bytes() const {
  size_t bytes = 0;
  for (const Region& r : regions()) bytes += r.device_bytes;
  return bytes;
}

size_t MoeWorkspace::symmetric_bytes() const {
  size_t bytes = 0;
  for (const Region& r : regions()) bytes += r.symmetric_bytes;
  return bytes;
}

void MoeWorkspace::release() {
  std::vector<std::pair<std::string, std::shared_ptr<Shared>>> regions;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    regions.swap(regions_);
  }
  regions.clear();  // frees each region whose last user is gone (users keep theirs alive)
}

std::shared_ptr<MoeWorkspace> make_moe_workspace() { return std::make_shared<MoeWorkspace>(); }

}  // namespace megamoe
