#include "tokenizer/tokenizer_json_sax.h"

#include "core/error.h"

namespace shardlm::tok {
namespace {

using json = nlohmann::json;

class Sax final : public nlohmann::json_sax<json> {
 public:
  Sax(TokenizerJsonData& out, const std::string& file) : out_(out), file_(file) {}

  bool null() override { return put(json(nullptr)); }
  bool boolean(bool v) override { return put(json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::Vocab) return vocab_entry(v);
    return put(json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::Vocab) return vocab_entry(static_cast<int64_t>(v));
    return put(json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return put(json(v)); }
  bool binary(binary_t&) override { return put(json()); }
  bool string(string_t& v) override {
    if (mode_ == Mode::Merges) {
      if (in_pair_) {
        pair_.push_back(std::move(v));
        return true;
      }
      size_t sp = v.find(' ');
      SHARDLM_CHECK(sp != std::string::npos && v.find(' ', sp + 1) == std::string::npos,
                    file_ << ": merge #" << out_.merges->size() << " \"" << v << "\" is not of the form \"a b\"");
      out_.merges->emplace_back(v.substr(0, sp), v.substr(sp + 1));
      return true;
    }
    return put(json(std::move(v)));
  }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool start_object(std::size_t) override {
    if (mode_ == Mode::None && at_model() && key_ == "vocab") {
      mode_ = Mode::Vocab;
      out_.vocab.emplace();
      out_.vocab->reserve(1 << 17);
      return true;
    }
    bool is_model = stack_.size() == 1 && key_ == "model";
    open(json::object());
    if (is_model) model_ = stack_.back();
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::Vocab) {
      mode_ = Mode::None;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::None && at_model() && key_ == "merges") {
      mode_ = Mode::Merges;
      out_.merges.emplace();
      out_.merges->reserve(1 << 17);
      return true;
    }
    if (mode_ == Mode::Merges) {
      SHARDLM_CHECK(!in_pair_, file_ << ": merge #" << out_.merges->size() << " is nested too deeply");
      in_pair_ = true;
      pair_.clear();
      return true;
    }
    open(json::array());
    return true;
  }
  bool end_array() override {
    if (mode_ == Mode::Merges) {
      if (!in_pair_) {
        mode_ = Mode::None;
        return true;
      }
      SHARDLM_CHECK(pair_.size() == 2, file_ << ": merge #" << out_.merges->size() << " must hold two tokens");
      out_.merges->emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      in_pair_ = false;
      return true;
    }
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    SHARDLM_FAIL(file_ << ": malformed JSON: " << e.what());
  }

 private:
  enum class Mode { None, Vocab, Merges };

  bool at_model() const { return stack_.size() == 2 && stack_.back() == model_ && model_ != nullptr; }

  bool vocab_entry(int64_t v) {
    out_.vocab->emplace_back(std::move(key_), v);
    return true;
  }

  void open(json v) {
    put(std::move(v));
    stack_.push_back(last_);
  }

  // Places a value in the current container (or as the root); last_ points at it.
  bool put(json v) {
    SHARDLM_CHECK(mode_ == Mode::None, file_ << (mode_ == Mode::Vocab ? ": model.vocab ids must be integers"
                                                                       : ": malformed entry in model.merges"));
    if (stack_.empty()) {
      out_.root = std::move(v);
      last_ = &out_.root;
    } else if (json* top = stack_.back(); top->is_array()) {
      top->push_back(std::move(v));
      last_ = &top->back();
    } else {
      last_ = &((*top)[key_] = std::move(v));
    }
    return true;
  }

  TokenizerJsonData& out_;
  const std::string& file_;
  std::vector<json*> stack_;
  json* last_ = nullptr;
  json* model_ = nullptr;
  std::string key_;
  Mode mode_ = Mode::None;
  bool in_pair_ = false;
  std::vector<std::string> pair_;
};

}  // namespace

TokenizerJsonData parse_tokenizer_json(const std::string& text, const std::string& file) {
  TokenizerJsonData out;
  Sax sax(out, file);
  try {
    json::sax_parse(text, &sax);
  } catch (const json::exception& e) {
    SHARDLM_FAIL(file << ": malformed JSON: " << e.what());
  }
  return out;
}

}  // namespace shardlm::tok
