// Appending the columns of one group of several result files into one output group (shardlm
// merge): every 1-D dataset of the group is read a batch of rows at a time in its own element type
// and appended to an h5::Column of the same name and kind in the output.
#pragma once

#include <hdf5.h>

#include <memory>
#include <string>
#include <vector>

#include "io/h5_column.h"

namespace shardlm::h5 {

// The ColumnKind that holds a dataset's element type; throws Error naming it for any other type.
ColumnKind column_kind(hid_t dset, const std::string& context);

// The names of the datasets directly under `group`, sorted.
std::vector<std::string> dataset_names(hid_t group, const std::string& context);

class GroupAppender {
 public:
  // Output group `name` ("requests") of out_file; created by the first append() of an input that has it.
  GroupAppender(hid_t out_file, std::string name, std::string context);
  ~GroupAppender();
  GroupAppender(const GroupAppender&) = delete;
  GroupAppender& operator=(const GroupAppender&) = delete;

  // Appends the group's rows of an input file: the length of its shortest column (a crash can leave
  // some columns a batch longer than others). Returns the rows appended, 0 when the input lacks the
  // group. Throws Error naming both files when its columns are not those of the first input.
  hsize_t append_from(hid_t in_file, const std::string& in_context);
  // Rows of the group in `in_file` that append_from would copy (0 when the group is absent).
  static hsize_t rows_in(hid_t in_file, const std::string& name, const std::string& in_context);
  hsize_t rows() const { return rows_; }
  bool created() const { return group_.get() >= 0; }

 private:
  hid_t out_file_;
  std::string name_, ctx_, first_input_;
  Id group_;
  std::vector<std::string> names_;
  std::vector<ColumnKind> kinds_;
  std::vector<std::unique_ptr<Column>> columns_;
  hsize_t rows_ = 0;
};

}  // namespace shardlm::h5
