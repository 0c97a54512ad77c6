#include "io/h5_column.h"

namespace shardlm::h5 {
namespace {

// (file type, memory type) for a kind; both owned copies.
std::pair<Id, Id> types_for(ColumnKind kind) {
  switch (kind) {
    case ColumnKind::kInt32: return {Id(H5Tcopy(H5T_STD_I32LE)), Id(H5Tcopy(H5T_NATIVE_INT32))};
    case ColumnKind::kInt64: return {Id(H5Tcopy(H5T_STD_I64LE)), Id(H5Tcopy(H5T_NATIVE_INT64))};
    case ColumnKind::kFloat64: return {Id(H5Tcopy(H5T_IEEE_F64LE)), Id(H5Tcopy(H5T_NATIVE_DOUBLE))};
    case ColumnKind::kString: return {make_utf8_string_type(), make_utf8_string_type()};
    case ColumnKind::kVlenInt32: return {Id(H5Tvlen_create(H5T_STD_I32LE)), Id(H5Tvlen_create(H5T_NATIVE_INT32))};
    case ColumnKind::kVlenFloat32: return {Id(H5Tvlen_create(H5T_IEEE_F32LE)), Id(H5Tvlen_create(H5T_NATIVE_FLOAT))};
    case ColumnKind::kVlenFloat64:
      return {Id(H5Tvlen_create(H5T_IEEE_F64LE)), Id(H5Tvlen_create(H5T_NATIVE_DOUBLE))};
  }
  return {};
}

}  // namespace

Column::Column(hid_t parent, const std::string& name, ColumnKind kind, hsize_t chunk_rows, const std::string& context)
    : where_(context + " dataset '" + name + "'") {
  auto [file_type, mem_type] = types_for(kind);
  check(file_type.get(), "creating the file type", where_);
  check(mem_type.get(), "creating the memory type", where_);
  const hsize_t zero = 0, unlimited = H5S_UNLIMITED;
  Id space(H5Screate_simple(1, &zero, &unlimited));
  check(space.get(), "H5Screate_simple", where_);
  Id dcpl(H5Pcreate(H5P_DATASET_CREATE));
  check(dcpl.get(), "H5Pcreate", where_);
  check(H5Pset_chunk(dcpl.get(), 1, &chunk_rows), "H5Pset_chunk", where_);
  dset_ = Id(H5Dcreate2(parent, name.c_str(), file_type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT));
  check(dset_.get(), "H5Dcreate2", where_);
  mem_type_ = std::move(mem_type);
}

Column::Column(hid_t parent, const std::string& name, ColumnKind kind, const std::string& context)
    : where_(context + " dataset '" + name + "'") {
  dset_ = Id(H5Dopen2(parent, name.c_str(), H5P_DEFAULT));
  check(dset_.get(), "opening the dataset to append (is this a shardlm output file?)", where_);
  mem_type_ = std::move(types_for(kind).second);
  Id space(H5Dget_space(dset_.get()));
  check(space.get(), "H5Dget_space", where_);
  check(H5Sget_simple_extent_dims(space.get(), &size_, nullptr), "H5Sget_simple_extent_dims", where_);
}

void Column::truncate(hsize_t n) {
  if (n >= size_) return;
  check(H5Dset_extent(dset_.get(), &n), "H5Dset_extent", where_);
  size_ = n;
}

void Column::append(const void* data, size_t n) {
  if (n == 0) return;
  const hsize_t start = size_, count = n, new_size = size_ + n;
  check(H5Dset_extent(dset_.get(), &new_size), "H5Dset_extent", where_);
  Id file_space(H5Dget_space(dset_.get()));
  check(file_space.get(), "H5Dget_space", where_);
  check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
        "H5Sselect_hyperslab", where_);
  Id mem_space(H5Screate_simple(1, &count, nullptr));
  check(mem_space.get(), "H5Screate_simple", where_);
  check(H5Dwrite(dset_.get(), mem_type_.get(), mem_space.get(), file_space.get(), H5P_DEFAULT, data), "H5Dwrite",
        where_);
  size_ = new_size;
}

}  // namespace shardlm::h5
