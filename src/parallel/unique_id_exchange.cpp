#include "parallel/unique_id_exchange.h"

namespace shardlm {

UniqueIdBytes exchange_unique_id(Communicator& boot, const std::function<UniqueIdBytes()>& make_id) {
  UniqueIdBytes id{};
  if (boot.rank() == 0) id = make_id();
  boot.broadcast(id.data(), id.size(), CommDType::kU8, 0);
  return id;
}

}  // namespace shardlm
