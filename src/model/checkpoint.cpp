#include "model/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/file_util.h"
#include "model/mapped_file.h"
#include "model/safetensors.h"

namespace shardlm {

namespace fs = std::filesystem;

namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}


}  // namespace

Checkpoint::~Checkpoint() = default;

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  SHARDLM_CHECK(fs::is_directory(dir), "checkpoint directory " << dir << " does not exist or is not a directory");
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;

  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();
  std::vector<std::string> files;                      // shard paths, in first-seen order
  std::map<std::string, std::string> index_map;        // tensor -> shard path (index only)
  if (fs::exists(index_path)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(index_path));
    } catch (const nlohmann::json::exception& e) {
      SHARDLM_FAIL(index_path << ": not valid JSON: " << e.what());
    }
    SHARDLM_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                  index_path << ": missing 'weight_map' object");
    std::set<std::string> seen;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      SHARDLM_CHECK(it->is_string(), index_path << ": weight_map entry for tensor '" << it.key()
                                                << "' is not a file name");
      const std::string shard = it->get<std::string>();
      SHARDLM_CHECK(!shard.empty() && shard.find("..") == std::string::npos && shard[0] != '/',
                    index_path << ": weight_map entry for tensor '" << it.key() << "' names an invalid file '"
                               << shard << "'");
      const std::string path = (fs::path(dir) / shard).string();
      SHARDLM_CHECK(fs::exists(path), index_path << ": shard file " << path << " (holding tensor '" << it.key()
                                                 << "') is missing");
      if (seen.insert(path).second) files.push_back(path);
      index_map[it.key()] = path;
    }
    SHARDLM_CHECK(!files.empty(), index_path << ": weight_map is empty");
  } else if (fs::exists(single_path)) {
    files.push_back(single_path);
  } else {
    SHARDLM_FAIL("checkpoint directory " << dir
                                         << " holds neither model.safetensors nor model.safetensors.index.json");
  }

  for (const auto& path : files) ck->map_file(path, index_path, index_map, false);
  for (const auto& [name, path] : index_map) {
    SHARDLM_CHECK(ck->has(name), index_path << ": tensor '" << name << "' is listed in weight_map for " << path
                                            << " but that file does not hold it");
  }
  return ck;
}

void Checkpoint::map_file(const std::string& path, const std::string& index_path,
                          const std::map<std::string, std::string>& index_map, bool replace) {
  auto mf = std::make_unique<MappedFile>(path);
  SafetensorsHeader h = parse_safetensors_header(mf->data(), mf->size(), mf->size(), path);
  for (const auto& e : h.entries) {
    // Duplicates and misplaced tensors are found whatever their dtype.
    const auto prev = tensors_.find(e.name);
    const auto prev_unread = unread_.find(e.name);
    SHARDLM_CHECK(replace || (prev == tensors_.end() && prev_unread == unread_.end()),
                  "tensor '" << e.name << "' appears in both "
                             << (prev != tensors_.end() ? prev->second.file : prev_unread->second.file) << " and "
                             << path);
    if (!index_map.empty()) {
      auto im = index_map.find(e.name);
      // Extra tensors in a shard that the index does not list are tolerated (transformers does
      // the same) but a tensor the index places elsewhere is an inconsistency.
      SHARDLM_CHECK(im == index_map.end() || im->second == path, "tensor '" << e.name << "' is in " << path << " but "
                                                                            << index_path << " places it in "
                                                                            << im->second);
    }
    if (!e.unread.empty()) {
      // Kept to name it if the model asks for it (Checkpoint::get).
      tensors_.erase(e.name);  // replaced
      unread_[e.name] = {path, path + ": tensor '" + e.name + "' has dtype " + e.unread +
                                   ", which shardlm does not read (it reads F32, BF16, F16, F8_E4M3, I32, I64, U8)"};
      continue;
    }
    TensorView tv;
    tv.name = e.name;
    tv.file = path;
    tv.dtype = e.dtype;
    tv.shape = e.shape;
    tv.nbytes = static_cast<size_t>(e.end - e.begin);
    tv.data = mf->data() + h.data_offset + e.begin;
    tv.file_offset = h.data_offset + e.begin;
    unread_.erase(e.name);  // replaced
    tensors_[e.name] = std::move(tv);
  }
  files_.push_back(std::move(mf));
}

void Checkpoint::add_file(const std::string& path) {
  SHARDLM_CHECK(fs::is_regular_file(path), "safetensors file " << path << " does not exist");
  map_file(path, "", {}, true);
}

bool Checkpoint::has(const std::string& name) const { return tensors_.count(name) != 0 || unread_.count(name) != 0; }

const TensorView& Checkpoint::get(const std::string& name) const {
  {
    std::lock_guard<std::mutex> lock(asked_mutex_);
    asked_.insert(name);
  }
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    const auto unread = unread_.find(name);
    SHARDLM_CHECK(unread == unread_.end(), unread->second.why);
  }
  SHARDLM_CHECK(it != tensors_.end(), "checkpoint " << dir_ << " has no tensor '" << name << "'");
  return it->second;
}

const TensorView& Checkpoint::get(const std::string& name, const std::vector<int64_t>& shape) const {
  const TensorView& t = get(name);
  SHARDLM_CHECK(t.shape == shape, t.file << ": tensor '" << name << "' has shape " << shape_str(t.shape)
                                         << " but the model config expects " << shape_str(shape));
  return t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

std::vector<std::string> Checkpoint::all_names() const {
  std::vector<std::string> out = names();
  for (const auto& kv : unread_) out.push_back(kv.first);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());  // one add_file replaced
  return out;
}

bool Checkpoint::was_read(const std::string& name) const {
  std::lock_guard<std::mutex> lock(asked_mutex_);
  return asked_.count(name) != 0;
}

size_t Checkpoint::nbytes_of(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? 0 : it->second.nbytes;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& kv : tensors_) n += kv.second.nbytes;
  return n;
}

}  // namespace shardlm
