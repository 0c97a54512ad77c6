#include "tokenizer/hf_tokenizer.h"

#include "tokenizer/utf8.h"

namespace shardlm::tok {

HfTokenizer::HfTokenizer(HfTokenizerParts parts) : p_(std::move(parts)) {
  const auto& vocab = p_.model->id_to_token();
  size_t n = vocab.size();
  for (const auto& a : p_.added) n = std::max(n, static_cast<size_t>(a.id) + 1);
  has_token_.assign(n, 0);
  special_.assign(n, 0);
  pieces_.resize(n);
  const bool first_differs = p_.decoder->first_piece_differs();
  if (first_differs) first_pieces_.resize(n);
  for (size_t i = 0; i < vocab.size(); ++i) {
    if (!vocab[i].empty()) {
      pieces_[i] = p_.decoder->piece(vocab[i]);
      if (first_differs) first_pieces_[i] = p_.decoder->piece(vocab[i], true);
      has_token_[i] = 1;
    }
  }
  // Added tokens override the vocab entry of the same id.
  for (const auto& a : p_.added) {
    pieces_[a.id] = p_.decoder->piece(a.content);
    if (first_differs) first_pieces_[a.id] = p_.decoder->piece(a.content, true);
    has_token_[a.id] = 1;
    special_[a.id] = a.special;
    if (a.normalized && p_.normalizer) {
      norm_matcher_.add(a, p_.normalizer->normalize(a.content));
    } else if (a.normalized) {
      norm_matcher_.add(a, a.content);
    } else {
      raw_matcher_.add(a, a.content);
    }
  }
}

std::optional<int32_t> HfTokenizer::token_to_id(const std::string& token) const {
  for (const auto& a : p_.added)
    if (a.content == token) return a.id;
  return p_.model->token_to_id(token);
}

void HfTokenizer::encode_plain(const std::string& segment, bool at_text_start, std::vector<int32_t>& out) const {
  std::vector<Segment> subs;
  if (p_.normalizer) {
    norm_matcher_.split(p_.normalizer->normalize(segment), subs);
  } else {
    norm_matcher_.split(segment, subs);
  }
  std::vector<std::string> words;
  for (auto& sub : subs) {
    if (sub.id >= 0) {
      out.push_back(sub.id);
    } else if (p_.pretokenizer) {
      words.clear();
      words.push_back(std::move(sub.text));
      p_.pretokenizer->split(words, at_text_start);
      for (const auto& w : words) p_.model->encode_word(w, out);
    } else {
      p_.model->encode_word(sub.text, out);
    }
    at_text_start = false;
  }
}

std::vector<int32_t> HfTokenizer::encode(const std::string& text_in) const {
  const std::string text = repair_utf8(text_in);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::vector<Segment> segs;
  raw_matcher_.split(text, segs);
  bool at_start = true;
  for (const auto& s : segs) {
    if (s.id >= 0) out.push_back(s.id);
    else encode_plain(s.text, at_start, out);
    at_start = false;
  }
  return out;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= pieces_.size() || !has_token_[id]) continue;
    if (skip_special && special_[id]) continue;
    if (!first) bytes += p_.decoder->separator();
    bytes += first && !first_pieces_.empty() ? first_pieces_[id] : pieces_[id];
    first = false;
  }
  return p_.decoder->finish(std::move(bytes));
}

std::string HfTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return {};
  return pieces_[id];
}

}  // namespace shardlm::tok
