#include "afd/common/error.h"

namespace afd {

std::string Error::where() const { return fmt::format("{}:{}", file_, line_); }

}  // namespace afd
