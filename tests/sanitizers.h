// Whether a test binary runs under ThreadSanitizer (GCC defines
// __SANITIZE_THREAD__, clang answers __has_feature): every call runs
// several times slower there, so tests that check waits stretch them.
#pragma once

namespace strata::testing {

#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kUnderTsan = true;
#else
inline constexpr bool kUnderTsan = false;
#endif
#else
inline constexpr bool kUnderTsan = false;
#endif

}  // namespace strata::testing
