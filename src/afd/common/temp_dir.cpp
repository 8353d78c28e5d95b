#include "afd/common/temp_dir.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "afd/common/error.h"

namespace afd {

std::string MakePrivateTempDir(const std::string& prefix) {
  std::error_code ec;
  std::filesystem::path base = std::filesystem::temp_directory_path(ec);
  if (ec) base = "/tmp";
  const std::string pattern = (base / (prefix + "XXXXXX")).string();
  std::vector<char> path(pattern.begin(), pattern.end());
  path.push_back('\0');
  AFD_CHECK(mkdtemp(path.data()) != nullptr, "cannot create a temporary folder {}: {}", pattern,
            std::strerror(errno));
  return std::string(path.data());
}

}  // namespace afd
