// One JSONL prompt line -> ParsedRequest. Plain lines:
//   {"id": "a", "prompt": "Once upon" | "prompt_token_ids": [1, 2], "max_tokens": 16, ...}
// OpenAI batch lines (recognised by "custom_id" and "body"):
//   {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "...", ...}}
// Every problem becomes ParsedRequest::error ("line N: ..."), never an exception. Unknown fields
// are ignored, but vLLM / OpenAI sampling fields this engine does not apply are refused when they
// ask for something (n 4, a logit bias): the request would otherwise run as if they were
// not there. A sampling field set to null counts as absent (OpenAI clients write nulls).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "io/jsonl_request.h"
#include "io/request_reader.h"
#include "core/utf8.h"

namespace shardlm {
namespace {

using json = nlohmann::json;

// Thrown and caught inside this file only: the per-request error text, without the line prefix.
struct BadRequest {
  std::string msg;
};
[[noreturn]] void bad(std::string msg) { throw BadRequest{std::move(msg)}; }

std::string quoted(const std::string& field) { return "field '" + field + "'"; }

// The value at key, or nullptr when the key is absent or null.
const json* get_opt(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

int64_t get_int(const json& v, const std::string& field) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) bad(quoted(field) + " is out of range");
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {  // accept 16.0 (some writers emit every number as a float), not 1.5
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9.0e18) return static_cast<int64_t>(d);
  }
  bad(quoted(field) + " must be an integer");
}

double get_number(const json& v, const std::string& field) {
  if (!v.is_number()) bad(quoted(field) + " must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) bad(quoted(field) + " must be finite");
  return d;
}

std::string num_str(double d) { return json(d).dump(); }

// Capped at max_bytes, on a character boundary.
std::string capped(std::string s, size_t max_bytes = 200) {
  if (s.size() <= max_bytes) return s;
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

// A field's value for an error message: its JSON, capped, or what it is where it is nested deep or
// large. nlohmann's dump recurses, so a value of a million nested '[' (a 2 MB line, parsed without
// recursion) would overflow the stack; the walk here keeps its own.
std::string excerpt(const json& v) {
  std::vector<std::pair<const json*, int>> todo{{&v, 0}};
  for (size_t nodes = 0; !todo.empty(); ++nodes) {
    const auto [x, depth] = todo.back();
    todo.pop_back();
    if (depth > 16 || nodes > 256) return std::string("a JSON ") + v.type_name() + " too deep or large to show";
    if (x->is_structured())
      for (const json& c : *x) todo.emplace_back(&c, depth + 1);
  }
  return capped(v.dump());
}

// vLLM / OpenAI request fields that this engine does not apply: each may take its neutral value
// (n 1, an empty bad_words, null) and is otherwise an error naming it, so that a
// constrained, biased or truncated request never runs as a plain one.
void refuse_unapplied(const json& o, const std::string& p) {
  struct Rule {
    const char* key;
    bool (*neutral)(const json&);
    const char* why;
  };
  static const Rule rules[] = {
      {"n", [](const json& v) { return v.is_number() && v.get<double>() == 1; },
       "one completion is generated per request (give each sample its own line, id and seed)"},
      {"best_of", [](const json& v) { return v.is_number() && v.get<double>() == 1; },
       "one completion is generated per request"},
      {"echo", [](const json& v) { return v.is_boolean() && !v.get<bool>(); },
       "the prompt is not repeated in the output"},
      {"include_stop_str_in_output", [](const json& v) { return v.is_boolean() && !v.get<bool>(); },
       "the output ends before the stop string"},
      {"suffix", [](const json& v) { return v.is_string() && v.get<std::string>().empty(); }, "is not applied"},
      {"use_beam_search", [](const json& v) { return v.is_boolean() && !v.get<bool>(); }, "beam search is not run"},
      {"length_penalty", [](const json& v) { return v.is_number() && v.get<double>() == 1; }, "beam search is not run"},
      {"add_special_tokens", [](const json& v) { return v.is_boolean() && v.get<bool>(); },
       "BOS is prepended as the tokenizer config asks (give prompt_token_ids for other ids)"},
      {"skip_special_tokens", [](const json& v) { return v.is_boolean() && v.get<bool>(); },
       "output_text leaves special tokens out (output_tokens holds every id)"},
      {"truncate_prompt_tokens", [](const json&) { return false; }, "prompts are not truncated"},
      {"bad_words", [](const json& v) { return v.is_array() && v.empty(); }, "is not applied"},
      {"logits_processors", [](const json& v) { return v.is_array() && v.empty(); }, "is not applied"},
      {"guided_json", [](const json&) { return false; }, "guided decoding is not applied"},
      {"guided_regex", [](const json&) { return false; }, "guided decoding is not applied"},
      {"guided_choice", [](const json&) { return false; }, "guided decoding is not applied"},
      {"guided_grammar", [](const json&) { return false; }, "guided decoding is not applied"},
      {"structured_outputs", [](const json&) { return false; }, "guided decoding is not applied"},
      {"response_format",
       [](const json& v) {
         if (!v.is_object()) return false;
         const auto type = v.find("type");  // compared in place: a copy of a nested value recurses
         return type != v.end() && type->is_string() && type->get_ref<const std::string&>() == "text";
       },
       "only plain text is generated"},
  };
  for (const Rule& r : rules) {
    const json* v = get_opt(o, r.key);
    if (v && !r.neutral(*v)) bad(quoted(p + r.key) + " = " + excerpt(*v) + " is not supported: " + r.why);
  }
}

int32_t top_count(const json& v, const std::string& field) {
  const int64_t x = get_int(v, field);
  if (x < 0 || x > kMaxTopLogprobs)
    bad(quoted(field) + " must be in [0, " + std::to_string(kMaxTopLogprobs) + "] (got " + std::to_string(x) +
        "; vLLM's max_logprobs)");
  return static_cast<int32_t>(x);
}

// The completions API's logprobs (an integer N) or the chat API's (a boolean, with top_logprobs
// N), and vLLM's prompt_logprobs N; null is unset.
void parse_logprobs(const json& o, const std::string& p, SamplingOverrides& s) {
  const json* top = get_opt(o, "top_logprobs");
  if (const json* v = get_opt(o, "logprobs")) {
    if (v->is_boolean()) {
      if (v->get<bool>()) s.logprobs = top ? top_count(*top, p + "top_logprobs") : 0;
    } else {
      s.logprobs = top_count(*v, p + "logprobs");
    }
  }
  // As vLLM's chat requests: top_logprobs above 0 needs logprobs true.
  const json* flag = get_opt(o, "logprobs");
  const bool asked = flag && flag->is_boolean() && flag->get<bool>();
  if (top && !asked && top_count(*top, p + "top_logprobs") > 0)
    bad(quoted(p + "top_logprobs") + " needs \"logprobs\": true");
  if (const json* v = get_opt(o, "prompt_logprobs")) s.prompt_logprobs = top_count(*v, p + "prompt_logprobs");
}

int32_t token_id(const json& v, const std::string& field) {
  const int64_t x = get_int(v, field);
  if (x < 0 || x > std::numeric_limits<int32_t>::max())
    bad(quoted(field) + " is not a token id (" + std::to_string(x) + ")");
  return static_cast<int32_t>(x);
}

// allowed_token_ids, min_tokens and logit_bias (OpenAI's: token ids as the object's keys); null is
// unset. Ids past the model's vocabulary are refused when the request is admitted.
void parse_logit_controls(const json& o, const std::string& p, SamplingOverrides& s) {
  if (const json* v = get_opt(o, "allowed_token_ids")) {
    const std::string f = p + "allowed_token_ids";
    if (!v->is_array()) bad(quoted(f) + " must be a list of token ids");
    // As vLLM: an empty list would leave nothing to choose.
    if (v->empty()) bad(quoted(f) + " is empty");
    std::vector<int32_t> ids;
    for (size_t i = 0; i < v->size(); ++i) ids.push_back(token_id((*v)[i], f + "[" + std::to_string(i) + "]"));
    s.allowed_token_ids = std::move(ids);
  }
  if (const json* v = get_opt(o, "min_tokens")) {
    const int64_t x = get_int(*v, p + "min_tokens");
    if (x < 0) bad(quoted(p + "min_tokens") + " must be >= 0 (got " + std::to_string(x) + ")");
    s.min_tokens = x;
  }
  if (const json* v = get_opt(o, "logit_bias")) {
    const std::string f = p + "logit_bias";
    if (!v->is_object()) bad(quoted(f) + " must be an object of token ids to biases");
    std::vector<std::pair<int32_t, float>> bias;
    for (const auto& [key, value] : v->items()) {
      const std::string fk = f + "[" + key + "]";
      size_t end = 0;
      int64_t id = -1;
      try {
        id = std::stoll(key, &end);
      } catch (const std::exception&) {
        end = 0;
      }
      if (key.empty() || end != key.size() || id < 0 || id > std::numeric_limits<int32_t>::max())
        bad(quoted(fk) + ": the key is not a token id");
      const double b = get_number(value, fk);
      if (!std::isfinite(b)) bad(quoted(fk) + " must be a finite number");
      // vLLM's server clamps to OpenAI's range; then fp32, as its logits hold it.
      bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(std::clamp(b, -100.0, 100.0)));
    }
    std::sort(bias.begin(), bias.end());
    for (size_t i = 1; i < bias.size(); ++i)
      if (bias[i].first == bias[i - 1].first)
        bad(quoted(f) + " names token " + std::to_string(bias[i].first) + " twice");
    s.logit_bias = std::move(bias);
  }
}

void parse_overrides(const json& o, const std::string& p, SamplingOverrides& s) {
  // OpenAI's chat field max_completion_tokens replaces max_tokens; where both are given it wins, as
  // in vLLM's chat requests.
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (const json* v = get_opt(o, key)) {
      const int64_t x = get_int(*v, p + key);
      // vLLM's bound: a request generates at least one token.
      if (x < 1) bad(quoted(p + key) + " must be >= 1 (got " + std::to_string(x) + ")");
      s.max_tokens = x;
    }
  }
  if (const json* v = get_opt(o, "temperature")) {
    const double x = get_number(*v, p + "temperature");
    // vLLM's bound.
    if (!(x >= 0 && x <= 2)) bad(quoted(p + "temperature") + " must be in [0, 2] (got " + num_str(x) + ")");
    s.temperature = x;
  }
  if (const json* v = get_opt(o, "top_p")) {
    const double x = get_number(*v, p + "top_p");
    if (!(x > 0 && x <= 1)) bad(quoted(p + "top_p") + " must be in (0, 1] (got " + num_str(x) + ")");
    s.top_p = x;
  }
  if (const json* v = get_opt(o, "top_k")) {
    const int64_t x = get_int(*v, p + "top_k");
    if (x < -1) bad(quoted(p + "top_k") + " must be >= 1, or -1 or 0 for off (got " + std::to_string(x) + ")");
    s.top_k = x;
  }
  if (const json* v = get_opt(o, "min_p")) {
    const double x = get_number(*v, p + "min_p");
    if (!(x >= 0 && x <= 1)) bad(quoted(p + "min_p") + " must be in [0, 1] (got " + num_str(x) + ")");
    s.min_p = x;
  }
  // vLLM's bounds on its penalties.
  if (const json* v = get_opt(o, "repetition_penalty")) {
    const double x = get_number(*v, p + "repetition_penalty");
    if (!(x > 0)) bad(quoted(p + "repetition_penalty") + " must be > 0 (got " + num_str(x) + ")");
    s.repetition_penalty = x;
  }
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    if (const json* v = get_opt(o, key)) {
      const double x = get_number(*v, p + key);
      if (!(x >= -2 && x <= 2)) bad(quoted(p + key) + " must be in [-2, 2] (got " + num_str(x) + ")");
      (std::string(key) == "frequency_penalty" ? s.frequency_penalty : s.presence_penalty) = x;
    }
  }
  if (const json* v = get_opt(o, "seed")) {
    if (v->is_number_unsigned()) {
      s.seed = v->get<uint64_t>();
    } else {
      // vLLM takes any signed 64-bit seed: a negative one is its 64-bit pattern (modulo 2^64),
      // but -1, which vLLM reads as no seed (the request's own stream, from --seed and its id).
      const int64_t seed = get_int(*v, p + "seed");
      if (seed != -1) s.seed = static_cast<uint64_t>(seed);
    }
  }
  if (const json* v = get_opt(o, "stop")) {
    const std::string f = quoted(p + "stop");
    std::vector<std::string> stop;
    if (v->is_string()) {
      stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (const json& e : *v) {
        if (!e.is_string()) bad(f + " must be a string or a list of strings");
        stop.push_back(e.get<std::string>());
      }
    } else {
      bad(f + " must be a string or a list of strings");
    }
    for (const std::string& x : stop)
      if (x.empty()) bad(f + " must not contain an empty string");
    s.stop = std::move(stop);
  }
  if (const json* v = get_opt(o, "stop_token_ids")) {
    const std::string f = p + "stop_token_ids";
    if (!v->is_array()) bad(quoted(f) + " must be a list of token ids");
    std::vector<int32_t> ids;
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string fi = f + "[" + std::to_string(i) + "]";
      const int64_t x = get_int((*v)[i], fi);
      if (x < 0 || x > std::numeric_limits<int32_t>::max())
        bad(quoted(fi) + " is not a token id (" + std::to_string(x) + ")");
      ids.push_back(static_cast<int32_t>(x));
    }
    s.stop_token_ids = std::move(ids);
  }
  if (const json* v = get_opt(o, "ignore_eos")) {
    if (!v->is_boolean()) bad(quoted(p + "ignore_eos") + " must be true or false");
    s.ignore_eos = v->get<bool>();
  }
  parse_logprobs(o, p, s);
  parse_logit_controls(o, p, s);
  refuse_unapplied(o, p);
}

std::vector<int32_t> parse_token_ids(const json& v, const std::string& field) {
  if (!v.is_array()) bad(quoted(field) + " must be a list of integers");
  if (v.empty()) bad("empty prompt: " + quoted(field) + " is an empty list");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string fi = field + "[" + std::to_string(i) + "]";
    const int64_t x = get_int(v[i], fi);
    if (x < 0) bad(quoted(fi) + " is a negative token id (" + std::to_string(x) + ")");
    if (x > std::numeric_limits<int32_t>::max()) bad(quoted(fi) + " is out of range (" + std::to_string(x) + ")");
    ids.push_back(static_cast<int32_t>(x));
  }
  return ids;
}

// "prompt" / "prompt_token_ids" of a plain line, or body.prompt of an OpenAI line (a string, a list
// of token ids, or a list holding one of either, as the completions API allows).
void parse_prompt(const json& o, const std::string& p, bool openai, ParsedRequest& r) {
  const json* prompt = get_opt(o, "prompt");
  const json* ids = openai ? nullptr : get_opt(o, "prompt_token_ids");
  if (!prompt && !ids && o.contains("messages")) bad("chat messages need a chat template; not supported");
  if (prompt && ids) bad("give either 'prompt' or 'prompt_token_ids', not both");
  if (!prompt && !ids) bad("missing " + (openai ? quoted(p + "prompt") : "'prompt' (or 'prompt_token_ids')"));
  if (ids) {
    r.prompt_token_ids = parse_token_ids(*ids, p + "prompt_token_ids");
    return;
  }
  const std::string f = p + "prompt";
  if (openai && prompt->is_array()) {
    if (prompt->size() == 1 && (*prompt)[0].is_string()) {
      prompt = &(*prompt)[0];
    } else if (prompt->size() == 1 && (*prompt)[0].is_array()) {
      // A batch of one token list, as the completions API allows.
      r.prompt_token_ids = parse_token_ids((*prompt)[0], f + "[0]");
      return;
    } else if (!prompt->empty() && (*prompt)[0].is_number()) {
      r.prompt_token_ids = parse_token_ids(*prompt, f);
      return;
    } else {
      bad(quoted(f) + " must be a string, a list of token ids, or a list with one of either");
    }
  }
  if (!prompt->is_string())
    bad(quoted(f) +
        (openai ? " must be a string, a list of token ids, or a list with one of either" : " must be a string"));
  std::string text = prompt->get<std::string>();
  if (text.empty()) bad("empty prompt: " + quoted(f) + " is \"\"");
  r.prompt = std::move(text);
}

std::string parse_id(const json& v, const std::string& field) {
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s.empty()) bad(quoted(field) + " is empty");
    return s;
  }
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_float()) return v.dump();
  bad(quoted(field) + " must be a string or a number");
}

// nlohmann's what() minus its "[json.exception.parse_error.101] parse error at line 1, " prefix,
// capped (on a character boundary) so that a huge line does not make a huge message.
std::string short_parse_error(const json::exception& e) {
  // The "last read" excerpt can end inside a multi-byte character ("18\xEF" when a number runs
  // into one): repair so that the message (written to UTF-8 outputs) stays valid UTF-8.
  std::string m = repair_utf8(e.what());
  if (auto pos = m.find("] "); pos != std::string::npos) m = m.substr(pos + 2);
  if (m.rfind("parse error at line 1, ", 0) == 0) m = m.substr(23);
  m = capped(m);
  return m;
}

bool has_replacement(const std::string& s) { return s.find("\xEF\xBF\xBD") != std::string::npos; }

// The line held ill-formed UTF-8 and was parsed after repair_utf8. An error when the bad bytes
// landed in a field the request uses; bytes in ignored fields are let through.
void check_repaired_fields(const ParsedRequest& r, bool openai) {
  if (r.prompt && has_replacement(*r.prompt)) bad("prompt is not valid UTF-8");
  if (r.overrides.stop)
    for (const std::string& s : *r.overrides.stop)
      if (has_replacement(s)) bad(quoted(openai ? "body.stop" : "stop") + " is not valid UTF-8");
}

}  // namespace

ParsedRequest parse_jsonl_request(const std::string& line, int64_t line_no, bool require_openai_batch) {
  ParsedRequest r;
  r.line = line_no;  // the id stays empty until the line's is read (request_key)
  const std::string where = "line " + std::to_string(line_no) + ": ";

  json doc;
  bool repaired = false;
  try {
    doc = json::parse(line);
  } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
    if (is_valid_utf8(line)) {
      r.error = where + "not valid JSON (" + short_parse_error(e) + ")";
      return r;
    }
    // nlohmann rejects ill-formed UTF-8 anywhere; parse a repaired copy to learn which field it is.
    repaired = true;
    try {
      doc = json::parse(repair_utf8(line));
    } catch (const json::exception& e2) {
      r.error = where + "not valid JSON (" + short_parse_error(e2) + ")";
      return r;
    }
  }

  bool openai = false;
  try {
    if (!doc.is_object()) bad(std::string("expected a JSON object, got ") + doc.type_name());
    openai = doc.contains("custom_id") && doc.contains("body");
    if (require_openai_batch && !openai) bad("expected an OpenAI batch line with 'custom_id' and 'body'");
    const char* id_key = openai ? "custom_id" : "id";
    const json* id = get_opt(doc, id_key);
    const std::string read = id ? parse_id(*id, id_key) : std::to_string(line_no);
    if (repaired && has_replacement(read)) bad(quoted(id_key) + " is not valid UTF-8");
    // The result file's strings end at a NUL: such an id would be stored cut short, and could
    // then collide with another on --resume.
    if (read.find('\0') != std::string::npos) bad(quoted(id_key) + " contains a NUL character (\\u0000)");
    r.id = read;
    const json* body = &doc;
    std::string prefix;
    if (openai) {
      body = &doc.at("body");
      if (!body->is_object()) bad(quoted("body") + " must be an object");
      prefix = "body.";
    }
    parse_prompt(*body, prefix, openai, r);  // first: a chat line's error names the missing template
    if (openai) {
      // The completions endpoint is the one this engine serves.
      if (const json* url = get_opt(doc, "url")) {
        if (!url->is_string() || url->get<std::string>() != "/v1/completions")
          bad(quoted("url") + " = " + excerpt(*url) +
              " is not supported (the completions endpoint, /v1/completions, is)");
      }
    }
    parse_overrides(*body, prefix, r.overrides);
    if (repaired) check_repaired_fields(r, openai);
  } catch (const BadRequest& e) {
    r.error = where + e.msg;
  } catch (const std::exception& e) {  // not expected: every access above is type-checked first
    r.error = where + "cannot read the request: " + e.what();
  }
  if (!r.error.empty()) {
    r.prompt.reset();
    r.prompt_token_ids.reset();
    r.overrides = SamplingOverrides{};
  }
  return r;
}

ParsedRequest parse_jsonl_line(const std::string& line, int64_t line_no) {
  return parse_jsonl_request(line, line_no, false);
}

}  // namespace shardlm
