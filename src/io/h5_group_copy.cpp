#include "io/h5_group_copy.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "core/error.h"

namespace shardlm::h5 {

namespace {

constexpr hsize_t kChunkRows = 256;   // as the result writer's columns
constexpr hsize_t kCopyRows = 4096;   // rows read and appended at a time

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

Id open_dataset(hid_t group, const std::string& name, const std::string& where) {
  Id d(H5Dopen2(group, name.c_str(), H5P_DEFAULT));
  check(d.get(), "opening", where);
  return d;
}

hsize_t dataset_rows(hid_t dset, const std::string& where) {
  Id space(H5Dget_space(dset));
  check(space.get(), "H5Dget_space", where);
  SHARDLM_CHECK(H5Sget_simple_extent_ndims(space.get()) == 1, where << ": expected a 1-D column");
  hsize_t n = 0;
  check(H5Sget_simple_extent_dims(space.get(), &n, nullptr), "H5Sget_simple_extent_dims", where);
  return n;
}

// Rows [0, n) of src appended to dst, read in the dataset's own (native) element type: for every
// ColumnKind that is the memory layout Column::append expects.
void append_rows(hid_t src, hsize_t n, ColumnKind kind, Column& dst, const std::string& where) {
  Id file_type(H5Dget_type(src));
  check(file_type.get(), "H5Dget_type", where);
  Id mem_type(H5Tget_native_type(file_type.get(), H5T_DIR_ASCEND));
  check(mem_type.get(), "H5Tget_native_type", where);
  const size_t elem = H5Tget_size(mem_type.get());
  const bool variable = kind == ColumnKind::kString || kind == ColumnKind::kVlenInt32 ||
                        kind == ColumnKind::kVlenFloat32 || kind == ColumnKind::kVlenFloat64;
  std::vector<unsigned char> buf(static_cast<size_t>(std::min(n, kCopyRows)) * elem);
  for (hsize_t start = 0; start < n; start += kCopyRows) {
    const hsize_t count = std::min(kCopyRows, n - start);
    Id file_space(H5Dget_space(src));
    check(file_space.get(), "H5Dget_space", where);
    check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
          "H5Sselect_hyperslab", where);
    Id mem_space(H5Screate_simple(1, &count, nullptr));
    check(mem_space.get(), "H5Screate_simple", where);
    check(H5Dread(src, mem_type.get(), mem_space.get(), file_space.get(), H5P_DEFAULT, buf.data()), "reading", where);
    // Strings and lists read into memory HDF5 allocated: handed back whatever append() does.
    struct Reclaim {
      hid_t type, space;
      void* data;
      bool on;
      ~Reclaim() {
        if (on) H5Dvlen_reclaim(type, space, H5P_DEFAULT, data);
      }
    } reclaim{mem_type.get(), mem_space.get(), buf.data(), variable};
    dst.append(buf.data(), static_cast<size_t>(count));
  }
}

}  // namespace

ColumnKind column_kind(hid_t dset, const std::string& context) {
  Id type(H5Dget_type(dset));
  check(type.get(), "H5Dget_type", context);
  const size_t size = H5Tget_size(type.get());
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER:
      if (size == 4) return ColumnKind::kInt32;
      if (size == 8) return ColumnKind::kInt64;
      break;
    case H5T_FLOAT:
      if (size == 8) return ColumnKind::kFloat64;
      break;
    case H5T_STRING:
      if (H5Tis_variable_str(type.get()) > 0) return ColumnKind::kString;
      break;
    case H5T_VLEN: {
      Id base(H5Tget_super(type.get()));
      check(base.get(), "H5Tget_super", context);
      const size_t base_size = H5Tget_size(base.get());
      const H5T_class_t base_class = H5Tget_class(base.get());
      if (base_class == H5T_INTEGER && base_size == 4) return ColumnKind::kVlenInt32;
      if (base_class == H5T_FLOAT && base_size == 4) return ColumnKind::kVlenFloat32;
      if (base_class == H5T_FLOAT && base_size == 8) return ColumnKind::kVlenFloat64;
      break;
    }
    default:
      break;
  }
  SHARDLM_FAIL(
      context << ": not a result-file column (int32, int64, float64, string, or a list of int32/float32/float64)");
}

std::vector<std::string> dataset_names(hid_t group, const std::string& context) {
  H5G_info_t info;
  check(H5Gget_info(group, &info), "H5Gget_info", context);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < info.nlinks; ++i) {
    const ssize_t len = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    check(len, "H5Lget_name_by_idx", context);
    std::string name(static_cast<size_t>(len) + 1, '\0');
    check(H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), name.size(), H5P_DEFAULT),
          "H5Lget_name_by_idx", context);
    name.resize(static_cast<size_t>(len));
    Id obj(H5Oopen(group, name.c_str(), H5P_DEFAULT));
    check(obj.get(), "opening '" + name + "'", context);
    if (H5Iget_type(obj.get()) == H5I_DATASET) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

GroupAppender::GroupAppender(hid_t out_file, std::string name, std::string context)
    : out_file_(out_file), name_(std::move(name)), ctx_(std::move(context) + " /" + name_) {}

GroupAppender::~GroupAppender() = default;

hsize_t GroupAppender::rows_in(hid_t in_file, const std::string& name, const std::string& in_context) {
  if (H5Lexists(in_file, name.c_str(), H5P_DEFAULT) <= 0) return 0;
  const std::string where = in_context + " /" + name;
  Id g(H5Gopen2(in_file, name.c_str(), H5P_DEFAULT));
  check(g.get(), "opening the group", where);
  hsize_t n = std::numeric_limits<hsize_t>::max();
  for (const std::string& col : dataset_names(g.get(), where)) {
    Id d = open_dataset(g.get(), col, where + "/" + col);
    n = std::min(n, dataset_rows(d.get(), where + "/" + col));
  }
  if (n == std::numeric_limits<hsize_t>::max()) return 0;
  // Not the rows a killed run extended its columns by without committing them.
  if (const int64_t c = committed_rows(in_file, name); c >= 0) n = std::min(n, static_cast<hsize_t>(c));
  return n;
}

hsize_t GroupAppender::append_from(hid_t in_file, const std::string& in_context) {
  if (H5Lexists(in_file, name_.c_str(), H5P_DEFAULT) <= 0) return 0;
  const hsize_t n = rows_in(in_file, name_, in_context);
  const std::string where = in_context + " /" + name_;
  Id g(H5Gopen2(in_file, name_.c_str(), H5P_DEFAULT));
  check(g.get(), "opening the group", where);
  const std::vector<std::string> names = dataset_names(g.get(), where);
  std::vector<Id> dsets;
  std::vector<ColumnKind> kinds;
  for (const std::string& col : names) {
    dsets.push_back(open_dataset(g.get(), col, where + "/" + col));
    kinds.push_back(column_kind(dsets.back().get(), where + "/" + col));
  }
  if (!created()) {
    group_ = Id(H5Gcreate2(out_file_, name_.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    check(group_.get(), "creating the group", ctx_);
    for (size_t i = 0; i < names.size(); ++i) {
      columns_.push_back(std::make_unique<Column>(group_.get(), names[i], kinds[i], kChunkRows, ctx_));
    }
    names_ = names;
    kinds_ = kinds;
    first_input_ = in_context;
  }
  SHARDLM_CHECK(names == names_, where << " has the columns [" << join(names) << "] but " << first_input_ << " /"
                                       << name_ << " has [" << join(names_)
                                       << "]: merge files written by the same shardlm version");
  for (size_t i = 0; i < names.size(); ++i) {
    SHARDLM_CHECK(kinds[i] == kinds_[i], where << "/" << names[i] << ": element type differs from " << first_input_);
    append_rows(dsets[i].get(), n, kinds[i], *columns_[i], where + "/" + names[i]);
  }
  rows_ += n;
  return n;
}

}  // namespace shardlm::h5
