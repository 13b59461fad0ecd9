// Whether a test binary runs under ThreadSanitizer (GCC defines
// __SANITIZE_THREAD__, clang answers __has_feature): every call runs
// several times slower there, so tests that check waits stretch them. And
// under AddressSanitizer, which keeps freed memory in quarantine (256 MiB):
// tests that bound a process's memory allow for it.
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

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kUnderAsan = true;
#else
inline constexpr bool kUnderAsan = false;
#endif
#else
inline constexpr bool kUnderAsan = false;
#endif

}  // namespace strata::testing
