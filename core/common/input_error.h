// Base of every "bad input" error in KVScope: a file, field or argument that
// is not what it must be. The command line maps it to exit code 2; anything
// else that escapes is a runtime failure (exit 1). Messages name the file,
// the field and what was expected.
#pragma once

#include <stdexcept>
#include <string>

namespace kvscope {

class InputError : public std::runtime_error {
 public:
  InputError(std::string file, std::string field, const std::string& what)
      : std::runtime_error(format(file, field, what)),
        file_(std::move(file)),
        field_(std::move(field)) {}

  const std::string& file() const { return file_; }
  const std::string& field() const { return field_; }

 private:
  static std::string format(const std::string& file, const std::string& field,
                            const std::string& what) {
    std::string out = file;
    if (!field.empty()) out += out.empty() ? field : ": " + field;
    return out.empty() ? what : out + ": " + what;
  }

  std::string file_;
  std::string field_;
};

}  // namespace kvscope
