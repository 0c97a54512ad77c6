#include "parallel/result_messages.h"

#include <cstring>
#include <type_traits>

#include "core/error.h"

namespace shardlm {

namespace {

class Out {
 public:
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    s_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& v) {
    pod<uint64_t>(v.size());
    s_.append(v);
  }
  template <typename T>
  void vec(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    s_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

class In {
 public:
  explicit In(const std::string& s) : s_(s) {}
  template <typename T>
  T pod() {
    T v;
    need(sizeof v);
    std::memcpy(&v, s_.data() + at_, sizeof v);
    at_ += sizeof v;
    return v;
  }
  std::string str() {
    const uint64_t n = pod<uint64_t>();
    need(n);
    std::string v = s_.substr(at_, n);
    at_ += n;
    return v;
  }
  template <typename T>
  std::vector<T> vec() {
    const uint64_t n = pod<uint64_t>();
    SHARDLM_CHECK(n <= (s_.size() - at_) / sizeof(T), "malformed result message: vector of " << n << " elements");
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), s_.data() + at_, n * sizeof(T));  // an empty vector's data() may be null
    at_ += n * sizeof(T);
    return v;
  }
  void done() const { SHARDLM_CHECK(at_ == s_.size(), "malformed result message: " << s_.size() - at_ << " bytes left"); }

 private:
  void need(uint64_t n) const {
    SHARDLM_CHECK(n <= s_.size() - at_, "malformed result message: " << n << " bytes wanted, " << s_.size() - at_ << " left");
  }
  const std::string& s_;
  size_t at_ = 0;
};

}  // namespace

std::string pack_result(const RequestResult& r) {
  Out o;
  o.str(r.id);
  o.pod(r.line);
  o.vec(r.prompt_tokens);
  o.vec(r.output_tokens);
  o.str(r.output_text);
  o.pod(static_cast<int32_t>(r.finish_reason));
  o.vec(r.token_logprobs);
  o.vec(r.top_token_ids);
  o.vec(r.top_logprobs);
  o.vec(r.prompt_logprobs);
  o.vec(r.prompt_top_token_ids);
  o.vec(r.prompt_top_logprobs);
  o.str(r.error);
  o.pod(r.replica);
  o.pod(r.t_queued);
  o.pod(r.t_first_token);
  o.pod(r.t_finished);
  return o.take();
}

RequestResult unpack_result(const std::string& bytes) {
  In in(bytes);
  RequestResult r;
  r.id = in.str();
  r.line = in.pod<int64_t>();
  r.prompt_tokens = in.vec<int32_t>();
  r.output_tokens = in.vec<int32_t>();
  r.output_text = in.str();
  const int32_t reason = in.pod<int32_t>();
  SHARDLM_CHECK(
      reason >= static_cast<int32_t>(FinishReason::kNone) && reason <= static_cast<int32_t>(FinishReason::kAbort),
      "malformed result message: finish reason " << reason);
  r.finish_reason = static_cast<FinishReason>(reason);
  r.token_logprobs = in.vec<float>();
  r.top_token_ids = in.vec<int32_t>();
  r.top_logprobs = in.vec<float>();
  r.prompt_logprobs = in.vec<float>();
  r.prompt_top_token_ids = in.vec<int32_t>();
  r.prompt_top_logprobs = in.vec<float>();
  r.error = in.str();
  r.replica = in.pod<int32_t>();
  r.t_queued = in.pod<double>();
  r.t_first_token = in.pod<double>();
  r.t_finished = in.pod<double>();
  in.done();
  return r;
}

std::string pack_step(const StepRecord& s) {
  Out o;
  o.pod(static_cast<const StepFields&>(s));
  o.vec(s.expert_tokens);
  o.vec(s.stage_compute_s);
  o.vec(s.stage_comm_s);
  return o.take();
}

StepRecord unpack_step(const std::string& bytes) {
  In in(bytes);
  StepRecord s;
  static_cast<StepFields&>(s) = in.pod<StepFields>();
  s.expert_tokens = in.vec<int32_t>();
  s.stage_compute_s = in.vec<double>();
  s.stage_comm_s = in.vec<double>();
  in.done();
  return s;
}

}  // namespace shardlm
