// Byte encoding of finished requests and step records, for moving them between ranks.
#pragma once

#include <string>

#include "io/request.h"
#include "io/result_writer.h"

namespace shardlm {

std::string pack_result(const RequestResult& r);
RequestResult unpack_result(const std::string& bytes);  // throws Error on a malformed message
std::string pack_step(const StepRecord& s);
StepRecord unpack_step(const std::string& bytes);

}  // namespace shardlm
