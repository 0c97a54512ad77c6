#include "io/request.h"

namespace shardlm {

// The strings stored in /requests/finish_reason.
const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kError: return "error";
    case FinishReason::kAbort: return "abort";
  }
  return "unknown";
}

}  // namespace shardlm
