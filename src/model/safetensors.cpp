#include "model/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/error.h"

namespace shardlm {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;  // the limit the reference reader uses

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Reads a JSON integer >= 0; false when it is not one.
bool as_u64(const nlohmann::json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

// A shape / data_offsets value for an error message. Nested values print as [...] / {...}: dump()
// recurses, so a deeply nested value (a corrupt or hostile header) would overflow the stack.
std::string brief_json(const nlohmann::json& j) {
  if (!j.is_structured()) return j.dump();
  if (!j.is_array()) return "{...}";
  std::string s = "[";
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    if (i) s += ',';
    s += e.is_array() ? std::string("[...]") : e.is_object() ? std::string("{...}") : e.dump();
  }
  return s + "]";
}

const char* known_dtypes() { return "F32, BF16, F16, F8_E4M3, I32, I64, U8"; }

// The format's other dtypes and their element bits (F4 and F6 pack several to a byte); 0 for a name
// that is not one.
uint64_t unread_dtype_bits(const std::string& name) {
  static const struct {
    const char* name;
    uint64_t bits;
  } kTable[] = {{"BOOL", 8}, {"I8", 8},      {"U16", 16},    {"I16", 16}, {"U32", 32},    {"U64", 64},   {"F64", 64},
                {"C64", 64}, {"F8_E5M2", 8}, {"F8_E8M0", 8}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}};
  for (const auto& e : kTable)
    if (name == e.name) return e.bits;
  return 0;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* prefix, size_t prefix_len, uint64_t file_size,
                                           const std::string& file) {
  SHARDLM_CHECK(file_size >= 8 && prefix_len >= 8,
                file << ": not a safetensors file: " << file_size << " bytes, fewer than the 8-byte header length");
  const uint64_t n = read_le64(prefix);
  SHARDLM_CHECK(n <= kMaxHeaderBytes, file << ": safetensors header length " << n << " exceeds the 100 MB limit"
                                            << " (corrupt or not a safetensors file)");
  SHARDLM_CHECK(n <= file_size - 8, file << ": safetensors header length " << n << " runs past the end of the file ("
                                         << file_size << " bytes)");
  SHARDLM_CHECK(8 + n <= prefix_len, file << ": internal: only " << prefix_len << " of the " << 8 + n
                                          << " header bytes were provided");
  nlohmann::json j;
  // A name given twice would keep only its last entry: the reference reader refuses it, so do we.
  std::set<std::string> names;
  std::string twice;
  const auto find_twice = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && twice.empty() &&
        !names.insert(parsed.get<std::string>()).second)
      twice = parsed.get<std::string>();
    return true;
  };
  try {
    j = nlohmann::json::parse(prefix + 8, prefix + 8 + n, find_twice);
  } catch (const nlohmann::json::exception& e) {
    SHARDLM_FAIL(file << ": safetensors header is not valid JSON: " << e.what());
  }
  SHARDLM_CHECK(j.is_object(), file << ": safetensors header is not a JSON object");
  SHARDLM_CHECK(twice.empty(), file << ": tensor '" << twice << "' appears twice in the safetensors header");

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_len = file_size - h.data_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      SHARDLM_CHECK(it->is_object(), file << ": __metadata__ is not a JSON object");
      continue;
    }
    const auto& v = *it;
    SHARDLM_CHECK(v.is_object(), file << ": tensor '" << name << "': header entry is not a JSON object");
    SafetensorsEntry e;
    e.name = name;
    SHARDLM_CHECK(v.contains("dtype") && v["dtype"].is_string(),
                  file << ": tensor '" << name << "': missing or non-string 'dtype'");
    const std::string dt = v["dtype"].get<std::string>();
    uint64_t bits = 0;
    if (dtype_from_name(dt, &e.dtype)) {
      bits = 8 * dtype_size(e.dtype);
    } else {
      bits = unread_dtype_bits(dt);
      SHARDLM_CHECK(bits > 0, file << ": tensor '" << name << "': unknown dtype '" << dt
                                   << "' (supported: " << known_dtypes() << ")");
      e.unread = dt;
    }
    SHARDLM_CHECK(v.contains("shape") && v["shape"].is_array(),
                  file << ": tensor '" << name << "': missing or non-array 'shape'");
    unsigned __int128 numel = 1;
    for (const auto& d : v["shape"]) {
      uint64_t u;
      SHARDLM_CHECK(as_u64(d, &u) && u <= static_cast<uint64_t>(INT64_MAX),
                    file << ": tensor '" << name << "': shape " << brief_json(v["shape"])
                         << " has an entry that is not a non-negative integer");
      e.shape.push_back(static_cast<int64_t>(u));
      numel *= u;
      // Every partial product too, as the reference reader checks: numel() multiplies in int64.
      SHARDLM_CHECK(numel <= static_cast<unsigned __int128>(INT64_MAX),
                    file << ": tensor '" << name << "': shape " << brief_json(v["shape"]) << " is too large");
    }
    SHARDLM_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2 &&
                      as_u64(v["data_offsets"][0], &e.begin) && as_u64(v["data_offsets"][1], &e.end),
                  file << ": tensor '" << name << "': 'data_offsets' must be two non-negative integers, got "
                       << (v.contains("data_offsets") ? brief_json(v["data_offsets"]) : std::string("nothing")));
    SHARDLM_CHECK(e.begin <= e.end, file << ": tensor '" << name << "': data_offsets [" << e.begin << ", " << e.end
                                         << "] end before begin");
    SHARDLM_CHECK(numel * bits % 8 == 0, file << ": tensor '" << name << "': shape " << shape_str(e.shape) << " of "
                                              << dt << " is not a whole number of bytes");
    const unsigned __int128 want = numel * bits / 8;
    SHARDLM_CHECK(want == e.end - e.begin,
                  file << ": tensor '" << name << "': data_offsets [" << e.begin << ", " << e.end << "] hold "
                       << (e.end - e.begin) << " bytes but shape " << shape_str(e.shape) << " of " << dt
                       << " needs " << static_cast<uint64_t>(want));
    SHARDLM_CHECK(e.end <= data_len,
                  file << ": tensor '" << name << "': data_offsets [" << e.begin << ", " << e.end
                       << "] run past the end of the data section (" << data_len << " bytes; file "
                       << file_size << " bytes): the file is truncated or the header is corrupt");
    h.entries.push_back(std::move(e));
  }
  // The tensors, in offset order, tile the data section: no shared bytes, no gap, nothing after
  // the last (the reference reader's rule; a gap or a tail is a header that lost an entry).
  std::vector<const SafetensorsEntry*> order;
  for (const auto& e : h.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const auto* e : order) {
    if (e->begin < covered) {
      SHARDLM_FAIL(file << ": tensors '" << prev->name << "' [" << prev->begin << ", " << prev->end << ") and '"
                        << e->name << "' [" << e->begin << ", " << e->end << ") overlap");
    }
    SHARDLM_CHECK(e->begin == covered, file << ": tensor '" << e->name << "' starts at byte " << e->begin
                                            << " of the data section, leaving bytes [" << covered << ", " << e->begin
                                            << ") no tensor holds");
    covered = e->end;
    if (e->end > e->begin) prev = e;
  }
  SHARDLM_CHECK(covered == data_len, file << ": the tensors end at byte " << covered
                                          << " of the data section but it has " << data_len
                                          << " bytes: the header does not describe the file");
  return h;
}

// ---- writer ----

SafetensorsStreamWriter::SafetensorsStreamWriter(const std::string& path, std::vector<SafetensorsTensorDecl> decls)
    : path_(path), decls_(std::move(decls)) {
  nlohmann::ordered_json j;
  j["__metadata__"] = {{"format", "pt"}};
  uint64_t off = 0;
  for (const auto& d : decls_) {
    SHARDLM_CHECK(!d.name.empty() && d.name != "__metadata__", path << ": invalid tensor name '" << d.name << "'");
    SHARDLM_CHECK(!j.contains(d.name), path << ": tensor '" << d.name << "' declared twice");
    uint64_t n = dtype_size(d.dtype);
    for (auto s : d.shape) {
      SHARDLM_CHECK(s >= 0, path << ": tensor '" << d.name << "' has a negative dimension");
      n *= static_cast<uint64_t>(s);
    }
    j[d.name] = {{"dtype", dtype_name(d.dtype)}, {"shape", d.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  FILE* f = std::fopen(path.c_str(), "wb");
  SHARDLM_CHECK(f, "cannot create " << path << ": " << std::strerror(errno));
  fp_ = f;
  uint8_t len[8];
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  SHARDLM_CHECK(std::fwrite(len, 1, 8, f) == 8 && std::fwrite(header.data(), 1, header.size(), f) == header.size(),
                "write error on " << path);
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (fp_) std::fclose(static_cast<FILE*>(fp_));
}

void SafetensorsStreamWriter::write_next(const void* data, size_t nbytes) {
  SHARDLM_CHECK(fp_, path_ << ": write after finish()");
  SHARDLM_CHECK(next_ < decls_.size(), path_ << ": more tensors written than declared");
  const auto& d = decls_[next_];
  uint64_t want = dtype_size(d.dtype);
  for (auto s : d.shape) want *= static_cast<uint64_t>(s);
  SHARDLM_CHECK(nbytes == want, path_ << ": tensor '" << d.name << "': " << nbytes << " bytes given, shape "
                                      << shape_str(d.shape) << " needs " << want);
  if (nbytes) {
    SHARDLM_CHECK(std::fwrite(data, 1, nbytes, static_cast<FILE*>(fp_)) == nbytes,
                  "write error on " << path_ << " (tensor '" << d.name << "')");
  }
  ++next_;
}

void SafetensorsStreamWriter::finish() {
  SHARDLM_CHECK(fp_, path_ << ": finish() called twice");
  SHARDLM_CHECK(next_ == decls_.size(), path_ << ": only " << next_ << " of " << decls_.size()
                                              << " tensors were written");
  FILE* f = static_cast<FILE*>(fp_);
  fp_ = nullptr;
  bool ok = std::fflush(f) == 0;
  ok = (std::fclose(f) == 0) && ok;
  SHARDLM_CHECK(ok, "write error on " << path_ << " when closing: " << std::strerror(errno));
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsWriteItem>& items) {
  std::vector<SafetensorsTensorDecl> decls;
  for (const auto& it : items) decls.push_back({it.name, it.dtype, it.shape});
  SafetensorsStreamWriter w(path, std::move(decls));
  for (const auto& it : items) {
    size_t n = dtype_size(it.dtype);
    for (auto s : it.shape) n *= static_cast<size_t>(s);
    w.write_next(it.data, n);
  }
  w.finish();
}

}  // namespace shardlm
