#include "report/result_file.h"

#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>

#include "core/error.h"
#include "io/h5_util.h"

namespace shardlm::report {

namespace {

using h5::Id;

constexpr hsize_t kVlenRowsPerRead = 1 << 16;

// Read access to one open result file; every failure throws Error prefixed with ctx.
class FileReader {
 public:
  explicit FileReader(const std::string& path) : ctx_("result file '" + path + "'") {
    h5::silence_error_printing();
    std::error_code ec;
    SHARDLM_CHECK(std::filesystem::exists(path, ec), "cannot open result file '" << path << "': no such file");
    SHARDLM_CHECK(!std::filesystem::is_directory(path, ec), "cannot open result file '" << path << "': it is a directory");
    SHARDLM_CHECK(H5Fis_hdf5(path.c_str()) > 0,
                  "cannot open result file '" << path << "': not an HDF5 file (expected the --out of shardlm run)");
    file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    h5::check(file_, "opening", ctx_);
  }
  ~FileReader() {
    if (file_ >= 0) H5Fclose(file_);
  }
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  // The rows of a group ("requests", "steps") the writer's last flush committed; -1: not recorded.
  int64_t committed(const std::string& group) const { return h5::committed_rows(file_, group); }

  // Whether the object at an absolute path ("/requests/id") exists, checking each link on the way.
  bool exists(const std::string& path) const {
    std::string prefix;
    size_t pos = 1;
    while (pos <= path.size()) {
      const size_t next = std::min(path.find('/', pos), path.size());
      prefix = path.substr(0, next);
      if (H5Lexists(file_, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
      pos = next + 1;
    }
    return true;
  }

  // An open column of class want: its dataset, dataspace, file type and row count.
  struct Column {
    std::string where;
    Id d, space, ftype;
    hsize_t n = 0;
  };
  Column column(const std::string& path, H5T_class_t want, const char* what) const {
    Column c;
    c.where = ctx_ + " " + path;
    c.d = open(path);
    c.space = Id(H5Dget_space(c.d.get()));
    h5::check(c.space.get(), "H5Dget_space", c.where);
    c.n = rows(c.space.get(), c.where);
    c.ftype = Id(H5Dget_type(c.d.get()));
    h5::check(c.ftype.get(), "H5Dget_type", c.where);
    SHARDLM_CHECK(H5Tget_class(c.ftype.get()) == want, c.where << ": expected " << what << " column");
    return c;
  }

  std::optional<std::vector<int64_t>> ints(const std::string& path) const {
    return numbers<int64_t>(path, H5T_NATIVE_INT64);
  }
  std::optional<std::vector<double>> doubles(const std::string& path) const {
    return numbers<double>(path, H5T_NATIVE_DOUBLE);
  }

  std::optional<std::vector<std::string>> strings(const std::string& path) const {
    if (!exists(path)) return std::nullopt;
    const Column c = column(path, H5T_STRING, "a string");
    const std::string& where = c.where;
    const hsize_t n = c.n;
    std::vector<std::string> out;
    out.reserve(n);
    if (n == 0) return out;
    Id mem(H5Tcopy(H5T_C_S1));
    h5::check(H5Tset_cset(mem.get(), H5Tget_cset(c.ftype.get())), "H5Tset_cset", where);
    if (H5Tis_variable_str(c.ftype.get()) > 0) {
      h5::check(H5Tset_size(mem.get(), H5T_VARIABLE), "H5Tset_size", where);
      std::vector<char*> raw(n, nullptr);
      h5::check(H5Dread(c.d.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()), "reading", where);
      for (char* p : raw) out.emplace_back(p ? p : "");
      H5Dvlen_reclaim(mem.get(), c.space.get(), H5P_DEFAULT, raw.data());
    } else {
      const size_t size = H5Tget_size(c.ftype.get());
      h5::check(H5Tset_size(mem.get(), size), "H5Tset_size", where);
      std::vector<char> raw(n * size);
      h5::check(H5Dread(c.d.get(), mem.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()), "reading", where);
      for (hsize_t i = 0; i < n; ++i) {
        const char* p = raw.data() + i * size;
        out.emplace_back(p, strnlen(p, size));
      }
    }
    return out;
  }

  // The length of every row of a variable-length column (the rows themselves are dropped).
  std::optional<std::vector<int64_t>> vlen_lengths(const std::string& path) const {
    return vlen_rows<int64_t>(path, std::nullopt, [](const hvl_t& row) { return static_cast<int64_t>(row.len); });
  }

  // Every row of a variable-length integer column, its values converted to int64.
  std::optional<std::vector<std::vector<int64_t>>> int_lists(const std::string& path) const {
    return vlen_rows<std::vector<int64_t>>(path, H5T_NATIVE_INT64, [](const hvl_t& row) {
      const auto* p = static_cast<const int64_t*>(row.p);
      return std::vector<int64_t>(p, p + row.len);
    });
  }
  // Every row of a variable-length float column, its values converted to double.
  std::optional<std::vector<std::vector<double>>> double_lists(const std::string& path) const {
    return vlen_rows<std::vector<double>>(path, H5T_NATIVE_DOUBLE, [](const hvl_t& row) {
      const auto* p = static_cast<const double*>(row.p);
      return std::vector<double>(p, p + row.len);
    });
  }

  std::map<std::string, nlohmann::json> attributes() const {
    std::map<std::string, nlohmann::json> out;
    AttrVisit v{this, &out};
    hsize_t idx = 0;
    h5::check(H5Aiterate2(file_, H5_INDEX_NAME, H5_ITER_NATIVE, &idx, &FileReader::visit_attr, &v),
              "reading the attributes", ctx_);
    return out;
  }

 private:
  struct AttrVisit {
    const FileReader* self;
    std::map<std::string, nlohmann::json>* out;
  };

  // One scalar attribute: strings, integers and floats are kept; anything else is skipped.
  static herr_t visit_attr(hid_t loc, const char* name, const H5A_info_t*, void* data) {
    auto* v = static_cast<AttrVisit*>(data);
    const std::string where = v->self->ctx_ + " attribute '" + name + "'";
    Id attr(H5Aopen(loc, name, H5P_DEFAULT));
    if (attr.get() < 0) return -1;
    Id space(H5Aget_space(attr.get()));
    if (H5Sget_simple_extent_npoints(space.get()) != 1) return 0;
    Id ftype(H5Aget_type(attr.get()));
    switch (H5Tget_class(ftype.get())) {
      case H5T_STRING: {
        Id mem(H5Tcopy(H5T_C_S1));
        H5Tset_cset(mem.get(), H5Tget_cset(ftype.get()));
        if (H5Tis_variable_str(ftype.get()) > 0) {
          H5Tset_size(mem.get(), H5T_VARIABLE);
          char* p = nullptr;
          if (H5Aread(attr.get(), mem.get(), &p) < 0) return -1;
          (*v->out)[name] = std::string(p ? p : "");
          if (p) H5free_memory(p);
        } else {
          const size_t size = H5Tget_size(ftype.get());
          H5Tset_size(mem.get(), size);
          std::vector<char> buf(size + 1, '\0');
          if (H5Aread(attr.get(), mem.get(), buf.data()) < 0) return -1;
          (*v->out)[name] = std::string(buf.data(), strnlen(buf.data(), size));
        }
        return 0;
      }
      case H5T_INTEGER: {
        if (H5Tget_sign(ftype.get()) == H5T_SGN_NONE) {  // the seed: all 64 bits
          uint64_t x = 0;
          if (H5Aread(attr.get(), H5T_NATIVE_UINT64, &x) < 0) return -1;
          (*v->out)[name] = x;
          return 0;
        }
        int64_t x = 0;
        if (H5Aread(attr.get(), H5T_NATIVE_INT64, &x) < 0) return -1;
        (*v->out)[name] = x;
        return 0;
      }
      case H5T_FLOAT: {
        double x = 0;
        if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &x) < 0) return -1;
        (*v->out)[name] = x;
        return 0;
      }
      default:
        return 0;
    }
  }

  Id open(const std::string& path) const {
    Id d(H5Dopen2(file_, path.c_str(), H5P_DEFAULT));
    h5::check(d.get(), "opening", ctx_ + " " + path);
    return d;
  }

  static hsize_t rows(hid_t space, const std::string& where) {
    SHARDLM_CHECK(H5Sget_simple_extent_ndims(space) == 1, where << ": expected a 1-D column");
    hsize_t n = 0;
    h5::check(H5Sget_simple_extent_dims(space, &n, nullptr), "H5Sget_simple_extent_dims", where);
    return n;
  }

  template <typename T>
  std::optional<std::vector<T>> numbers(const std::string& path, hid_t mem_type) const {
    if (!exists(path)) return std::nullopt;
    const std::string where = ctx_ + " " + path;
    Id d = open(path);
    Id space(H5Dget_space(d.get()));
    h5::check(space.get(), "H5Dget_space", where);
    std::vector<T> out(rows(space.get(), where));
    if (!out.empty()) {
      h5::check(H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), "reading", where);
    }
    return out;
  }

  // Reads a variable-length column and maps each row (an hvl_t of values of mem_base, or of the
  // file's own base type in native form when mem_base is nullopt) through row_fn.
  template <typename Row, typename RowFn>
  std::optional<std::vector<Row>> vlen_rows(const std::string& path, std::optional<hid_t> mem_base,
                                            RowFn row_fn) const {
    if (!exists(path)) return std::nullopt;
    const Column c = column(path, H5T_VLEN, "a variable-length");
    const std::string& where = c.where;
    const hsize_t n = c.n;
    std::vector<Row> out;
    out.reserve(n);
    if (n == 0) return out;
    Id base(H5Tget_super(c.ftype.get()));
    h5::check(base.get(), "H5Tget_super", where);
    Id native(mem_base ? H5Tcopy(*mem_base) : H5Tget_native_type(base.get(), H5T_DIR_ASCEND));
    h5::check(native.get(), "H5Tget_native_type", where);
    Id mem(H5Tvlen_create(native.get()));
    h5::check(mem.get(), "H5Tvlen_create", where);
    // A slice of rows at a time: a whole token column of a large run (a million 4k-token prompts:
    // 16 GB of ids) is never in memory at once, only the rows' lengths or values kept.
    const hsize_t slice = std::min<hsize_t>(n, kVlenRowsPerRead);
    std::vector<hvl_t> raw(slice);
    Id mem_space(H5Screate_simple(1, &slice, nullptr));
    h5::check(mem_space.get(), "H5Screate_simple", where);
    for (hsize_t first = 0; first < n; first += slice) {
      hsize_t count = std::min(slice, n - first);
      h5::check(H5Sselect_hyperslab(c.space.get(), H5S_SELECT_SET, &first, nullptr, &count, nullptr),
                "H5Sselect_hyperslab", where);
      const hsize_t zero = 0;
      h5::check(H5Sselect_hyperslab(mem_space.get(), H5S_SELECT_SET, &zero, nullptr, &count, nullptr),
                "H5Sselect_hyperslab", where);
      h5::check(H5Dread(c.d.get(), mem.get(), mem_space.get(), c.space.get(), H5P_DEFAULT, raw.data()), "reading",
                where);
      for (hsize_t i = 0; i < count; ++i) out.push_back(row_fn(raw[i]));
      H5Dvlen_reclaim(mem.get(), mem_space.get(), H5P_DEFAULT, raw.data());
    }
    return out;
  }

  hid_t file_ = H5I_INVALID_HID;
  std::string ctx_;
};

// Columns of one group, cut to a common length: a crash can leave some columns a batch longer
// than others, and a column missing altogether reads as default values.
class GroupColumns {
 public:
  template <typename T>
  void add(std::optional<std::vector<T>> col, std::vector<T>* dst) {
    if (col) {
      n_ = std::min(n_, col->size());
      *dst = std::move(*col);
    }
    fits_.push_back([dst](size_t n) { dst->resize(n); });
  }
  // committed: the rows the file's last flush committed (-1: not recorded); a crash mid-flush can
  // leave every column longer than that, the rows past it holding anything.
  void finish(int64_t committed = -1) {
    size_t n = n_ == SIZE_MAX ? 0 : n_;
    if (committed >= 0) n = std::min(n, static_cast<size_t>(committed));
    for (auto& f : fits_) f(n);
  }

 private:
  size_t n_ = SIZE_MAX;
  std::vector<std::function<void(size_t)>> fits_;
};

}  // namespace

RunData load_run(const std::string& path) {
  FileReader f(path);
  RunData d;
  d.path = path;
  d.attrs = f.attributes();
  SHARDLM_CHECK(f.exists("/requests"), "result file '" << path << "' has no /requests group: not written by shardlm run");

  RequestRows& r = d.requests;
  GroupColumns rq;
  rq.add(f.strings("/requests/id"), &r.id);
  rq.add(f.strings("/requests/finish_reason"), &r.finish_reason);
  rq.add(f.strings("/requests/error"), &r.error);
  rq.add(f.vlen_lengths("/requests/prompt_tokens"), &r.prompt_len);
  rq.add(f.vlen_lengths("/requests/output_tokens"), &r.output_len);
  rq.add(f.doubles("/requests/t_queued"), &r.t_queued);
  rq.add(f.doubles("/requests/t_first_token"), &r.t_first_token);
  rq.add(f.doubles("/requests/t_finished"), &r.t_finished);
  rq.add(f.ints("/requests/replica"), &r.replica);
  rq.finish(f.committed("requests"));

  d.has_steps = f.exists("/steps");
  StepRows& s = d.steps;
  GroupColumns st;
  st.add(f.ints("/steps/step"), &s.step);
  st.add(f.ints("/steps/replica"), &s.replica);
  st.add(f.ints("/steps/batch_size"), &s.batch_size);
  st.add(f.ints("/steps/prefill_tokens"), &s.prefill_tokens);
  st.add(f.ints("/steps/decode_tokens"), &s.decode_tokens);
  st.add(f.ints("/steps/kv_blocks_used"), &s.kv_blocks_used);
  st.add(f.doubles("/steps/t_start"), &s.t_start);
  st.add(f.doubles("/steps/wall_s"), &s.wall_s);
  st.add(f.doubles("/steps/moe_dispatch_s"), &s.moe_dispatch_s);
  st.add(f.doubles("/steps/moe_combine_s"), &s.moe_combine_s);
  st.add(f.ints("/steps/moe_dispatch_bytes"), &s.moe_dispatch_bytes);
  st.add(f.ints("/steps/moe_combine_bytes"), &s.moe_combine_bytes);
  st.add(f.int_lists("/steps/expert_tokens"), &s.expert_tokens);
  st.add(f.double_lists("/steps/stage_compute_s"), &s.stage_compute_s);
  st.add(f.double_lists("/steps/stage_comm_s"), &s.stage_comm_s);
  st.finish(f.committed("steps"));

  d.has_ranks = f.exists("/ranks");
  RankRows& k = d.ranks;
  GroupColumns rk;
  rk.add(f.ints("/ranks/rank"), &k.rank);
  rk.add(f.ints("/ranks/replica"), &k.replica);
  rk.add(f.ints("/ranks/pp"), &k.pp);
  rk.add(f.ints("/ranks/tp"), &k.tp);
  k.has_dp = f.exists("/ranks/dp");
  rk.add(f.ints("/ranks/dp"), &k.dp);
  rk.add(f.ints("/ranks/local_rank"), &k.local_rank);
  rk.add(f.strings("/ranks/host"), &k.host);
  rk.add(f.ints("/ranks/load_bytes"), &k.load_bytes);
  rk.add(f.doubles("/ranks/load_s"), &k.load_s);
  rk.add(f.ints("/ranks/peak_rss_bytes"), &k.peak_rss_bytes);
  rk.add(f.ints("/ranks/tp_bytes_sent"), &k.tp_bytes_sent);
  rk.add(f.ints("/ranks/pp_bytes_sent"), &k.pp_bytes_sent);
  rk.add(f.ints("/ranks/replica_bytes_sent"), &k.replica_bytes_sent);
  k.has_ep_bytes_sent = f.exists("/ranks/ep_bytes_sent");
  rk.add(f.ints("/ranks/ep_bytes_sent"), &k.ep_bytes_sent);
  rk.add(f.ints("/ranks/device_used_bytes"), &k.device_used_bytes);
  rk.finish();

  OpProfileRows& o = d.op_profile;
  GroupColumns op;
  op.add(f.ints("/op_profile/rank"), &o.rank);
  op.add(f.strings("/op_profile/kind"), &o.kind);
  op.add(f.strings("/op_profile/section"), &o.section);
  op.add(f.ints("/op_profile/steps"), &o.steps);
  op.add(f.ints("/op_profile/calls"), &o.calls);
  op.add(f.doubles("/op_profile/seconds"), &o.seconds);
  op.add(f.doubles("/op_profile/step_seconds"), &o.step_seconds);
  op.add(f.ints("/op_profile/bytes"), &o.bytes);
  op.finish();
  return d;
}

RunningTime running_time(const RunData& d) {
  auto number = [&](const char* name) -> std::optional<double> {
    const auto it = d.attrs.find(name);
    if (it == d.attrs.end() || !it->second.is_number()) return std::nullopt;
    return it->second.get<double>();
  };
  RunningTime t;
  if (const std::optional<double> wall = number("wall_seconds"); wall && *wall >= 0) {
    t.seconds = *wall;
    t.ended = true;
    return t;
  }
  const RequestRows& r = d.requests;
  const double before = number("wall_seconds_before").value_or(0);
  const auto first = static_cast<size_t>(
      std::clamp<double>(number("session_rows_before").value_or(0), 0, static_cast<double>(r.size())));
  double last = 0;
  for (size_t i = first; i < r.size(); ++i) last = std::max(last, r.t_finished[i]);
  t.seconds = before + last;
  t.earlier = first > 0 || before > 0;
  return t;
}

}  // namespace shardlm::report
