#include "server/block_manager.h"

#include "megamoe/error.h"

namespace megamoe::server {

KvBlockManager::KvBlockManager(int num_blocks, int block_size) : num_blocks_(num_blocks), block_size_(block_size) {
  MEGAMOE_CHECK(num_blocks > 0, "num_kv_blocks ", num_blocks, " must be > 0");
  MEGAMOE_CHECK(block_size > 0, "kv_block_size ", block_size, " must be > 0");
  free_.reserve(size_t(num_blocks));
  // Lowest ids on top of the stack, so a fresh cache hands out 0, 1, 2, ...
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  in_use_.assign(size_t(num_blocks), 0);
}

bool KvBlockManager::ensure_capacity(Sequence& seq, int num_tokens) {
  const int needed = blocks_for_tokens(num_tokens) - int(seq.block_table.size());
  if (needed <= 0) return true;
  if (needed > num_free()) return false;
  for (int i = 0; i < needed; ++i) {
    const int32_t block = free_.back();
    free_.pop_back();
    in_use_[size_t(block)] = 1;
    seq.block_table.push_back(block);
  }
  return true;
}

void KvBlockManager::release(Sequence& seq) {
  for (int32_t block : seq.block_table) {
    MEGAMOE_CHECK(block >= 0 && block < num_blocks_ && in_use_[size_t(block)], "sequence ", seq.id,
                  " releases KV block ", block, " it does not own");
    in_use_[size_t(block)] = 0;
    free_.push_back(block);
  }
  seq.block_table.clear();
}

}  // namespace megamoe::server
