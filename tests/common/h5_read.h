// Reading the result file back with the HDF5 C API, for the writer tests.
#pragma once

#include <hdf5.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace shardlm::test {

// An HDF5 file opened read-only with default access properties. Within one process a second
// handle on a file the writer still holds works with these defaults (HDF5 shares the open file and
// requires the file-locking setting to match: H5Pset_file_locking(false) here fails with "file
// locking flag values don't match"). Another process needs HDF5_USE_FILE_LOCKING=FALSE instead.
class H5Reader {
 public:
  explicit H5Reader(const std::string& path) { file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT); }
  ~H5Reader() {
    if (file_ >= 0) H5Fclose(file_);
  }
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;
  bool ok() const { return file_ >= 0; }
  hid_t id() const { return file_; }

  hsize_t rows(const std::string& dset) const {
    hid_t d = H5Dopen2(file_, dset.c_str(), H5P_DEFAULT);
    if (d < 0) return 0;
    hid_t s = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(s, &n, nullptr);
    H5Sclose(s);
    H5Dclose(d);
    return n;
  }

  std::vector<std::string> strings(const std::string& dset) const {
    hid_t d = H5Dopen2(file_, dset.c_str(), H5P_DEFAULT);
    EXPECT_GE(d, 0) << dset;
    hid_t s = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(s, &n, nullptr);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    std::vector<char*> raw(n, nullptr);
    EXPECT_GE(H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()), 0) << dset;
    std::vector<std::string> out;
    for (char* p : raw) out.emplace_back(p ? p : "");
    H5Dvlen_reclaim(t, s, H5P_DEFAULT, raw.data());
    H5Tclose(t);
    H5Sclose(s);
    H5Dclose(d);
    return out;
  }

  template <typename T>
  std::vector<T> scalars(const std::string& dset, hid_t mem_type) const {
    hid_t d = H5Dopen2(file_, dset.c_str(), H5P_DEFAULT);
    EXPECT_GE(d, 0) << dset;
    hid_t s = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(s, &n, nullptr);
    std::vector<T> out(n);
    EXPECT_GE(H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), 0) << dset;
    H5Sclose(s);
    H5Dclose(d);
    return out;
  }

  template <typename T>
  std::vector<std::vector<T>> lists(const std::string& dset, hid_t base_mem_type) const {
    hid_t d = H5Dopen2(file_, dset.c_str(), H5P_DEFAULT);
    EXPECT_GE(d, 0) << dset;
    hid_t s = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(s, &n, nullptr);
    hid_t t = H5Tvlen_create(base_mem_type);
    std::vector<hvl_t> raw(n);
    EXPECT_GE(H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()), 0) << dset;
    std::vector<std::vector<T>> out;
    for (const hvl_t& h : raw) {
      const T* p = static_cast<const T*>(h.p);
      out.emplace_back(p, p + h.len);
    }
    H5Dvlen_reclaim(t, s, H5P_DEFAULT, raw.data());
    H5Tclose(t);
    H5Sclose(s);
    H5Dclose(d);
    return out;
  }

  bool has_attr(const std::string& name) const { return H5Aexists(file_, name.c_str()) > 0; }

  std::string string_attr(const std::string& name) const {
    hid_t a = H5Aopen(file_, name.c_str(), H5P_DEFAULT);
    EXPECT_GE(a, 0) << name;
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    char* p = nullptr;
    EXPECT_GE(H5Aread(a, t, &p), 0) << name;
    std::string out = p ? p : "";
    H5free_memory(p);
    H5Tclose(t);
    H5Aclose(a);
    return out;
  }

  template <typename T>
  T scalar_attr(const std::string& name, hid_t mem_type) const {
    hid_t a = H5Aopen(file_, name.c_str(), H5P_DEFAULT);
    EXPECT_GE(a, 0) << name;
    T v{};
    EXPECT_GE(H5Aread(a, mem_type, &v), 0) << name;
    H5Aclose(a);
    return v;
  }

 private:
  hid_t file_ = H5I_INVALID_HID;
};

}  // namespace shardlm::test
