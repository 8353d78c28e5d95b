// Private temporary folders for rank logs: a fresh, unpredictable name under the temp directory
// ($TMPDIR or /tmp), created with mode 0700 (mkdtemp), never an existing folder reused.
#pragma once

#include <string>

namespace afd {

// Creates TMP/<prefix>XXXXXX and returns its path. Throws afd::Error naming the path and errno.
std::string MakePrivateTempDir(const std::string& prefix);

}  // namespace afd
