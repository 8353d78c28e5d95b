// A non-owning reference to a callable (C++26's std::function_ref): what an interface takes
// when it calls the callable before returning and keeps nothing. Unlike std::function it never
// allocates, so a lambda capturing many locals costs nothing on a per-layer path.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace afd {

template <typename Signature>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  // The callable must outlive the FunctionRef (a temporary lambda argument does: it lives to the
  // end of the call's full expression).
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, FunctionRef>>>
  FunctionRef(F&& f)  // NOLINT(google-explicit-constructor): as std::function_ref
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

}  // namespace afd
