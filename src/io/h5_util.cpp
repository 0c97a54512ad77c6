#include "io/h5_util.h"

#include "core/error.h"

namespace shardlm::h5 {

void silence_error_printing() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {
herr_t take_innermost(unsigned n, const H5E_error2_t* err, void* data) {
  if (n == 0 && err != nullptr) {
    auto* out = static_cast<std::string*>(data);
    *out = std::string(err->func_name ? err->func_name : "?") + "(): " + (err->desc ? err->desc : "");
  }
  return 0;
}
}  // namespace

std::string last_error_message() {
  std::string msg;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &msg);
  return msg;
}

int64_t check(int64_t status, const std::string& what, const std::string& context) {
  if (status < 0) {
    const std::string detail = last_error_message();
    SHARDLM_FAIL(context << ": " << what << " failed" << (detail.empty() ? "" : ": ") << detail);
  }
  return status;
}

Id& Id::operator=(Id&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Id::reset() {
  if (id_ >= 0) H5Idec_ref(id_);
  id_ = H5I_INVALID_HID;
}

Id make_utf8_string_type() {
  Id t(H5Tcopy(H5T_C_S1));
  check(t.get(), "H5Tcopy", "string type");
  check(H5Tset_size(t.get(), H5T_VARIABLE), "H5Tset_size", "string type");
  check(H5Tset_cset(t.get(), H5T_CSET_UTF8), "H5Tset_cset", "string type");
  return t;
}

namespace {
void write_scalar_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type, const void* value,
                       const std::string& context) {
  const std::string where = context + " attribute '" + name + "'";
  if (check(H5Aexists(obj, name.c_str()), "H5Aexists", where) > 0)
    check(H5Adelete(obj, name.c_str()), "H5Adelete", where);
  Id space(H5Screate(H5S_SCALAR));
  check(space.get(), "H5Screate", where);
  Id attr(H5Acreate2(obj, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  check(attr.get(), "H5Acreate2", where);
  check(H5Awrite(attr.get(), mem_type, value), "H5Awrite", where);
}
}  // namespace

void write_attr(hid_t obj, const std::string& name, const std::string& value, const std::string& context) {
  Id t = make_utf8_string_type();
  const char* p = value.c_str();
  write_scalar_attr(obj, name, t.get(), t.get(), &p, context);
}

void write_attr(hid_t obj, const std::string& name, double value, const std::string& context) {
  write_scalar_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, context);
}

void write_attr(hid_t obj, const std::string& name, int64_t value, const std::string& context) {
  write_scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, context);
}

void write_attr(hid_t obj, const std::string& name, uint64_t value, const std::string& context) {
  write_scalar_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value, context);
}

int64_t committed_rows(hid_t file, const std::string& group) {
  const char* name = group == "requests" ? "rows_committed" : group == "steps" ? "steps_committed" : nullptr;
  if (!name || H5Aexists(file, name) <= 0) return -1;
  Id a(H5Aopen(file, name, H5P_DEFAULT));
  int64_t v = -1;
  if (a.get() < 0 || H5Aread(a.get(), H5T_NATIVE_INT64, &v) < 0) return -1;
  return v;
}

}  // namespace shardlm::h5
