// Mutexes that clang's thread-safety analysis understands (-Wthread-safety,
// run by deploy/check-thread-safety.sh): members say which lock guards them
// (ABSL_GUARDED_BY), functions which lock they need held
// (ABSL_EXCLUSIVE_LOCKS_REQUIRED), and a missing lock is a compile error
// there. libstdc++'s std::mutex carries no such annotations; these wrap it
// at no cost, and a lock can still be waited on with std::condition_variable
// (MutexLock::native()).
//
//   Mutex mu_;
//   int count_ ABSL_GUARDED_BY(mu_);
//   void Bump() { MutexLock lock(mu_); ++count_; }
//
// A lambda run under a lock it cannot see (a condition variable's
// predicate) says so: [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ... }.
#pragma once

#include <absl/base/thread_annotations.h>

#include <mutex>
#include <shared_mutex>

namespace strata {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool try_lock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) { return mu_.try_lock(); }
  // Tells the analysis the lock is held where it cannot see it.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class MutexLock;
  std::mutex mu_;
};

// Holds a Mutex for its scope. It may let go and take it again (Unlock,
// Lock), and is what a std::condition_variable waits with (native()).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu.mu_) {}
  // Takes over a lock the caller holds (after `if (mu.try_lock())`).
  MutexLock(Mutex& mu, std::adopt_lock_t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu)
      : lock_(mu.mu_, std::adopt_lock) {}
  // Not locked yet: Lock() takes it.
  MutexLock(Mutex& mu, std::defer_lock_t) ABSL_LOCKS_EXCLUDED(mu)
      : lock_(mu.mu_, std::defer_lock) {}
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  bool owns_lock() const { return lock_.owns_lock(); }
  std::unique_lock<std::mutex>& native() { return lock_; }

 private:
  std::unique_lock<std::mutex> lock_;
};

// A reader-writer lock: many readers or one writer.
class ABSL_LOCKABLE SharedMutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  void lock_shared() ABSL_SHARED_LOCK_FUNCTION() { mu_.lock_shared(); }
  void unlock_shared() ABSL_UNLOCK_FUNCTION() { mu_.unlock_shared(); }
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() {}

 private:
  friend class ReaderLock;
  friend class WriterLock;
  std::shared_mutex mu_;
};

// Holds a SharedMutex shared for its scope.
class ABSL_SCOPED_LOCKABLE ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mu) ABSL_SHARED_LOCK_FUNCTION(mu) : lock_(mu.mu_) {}
  ~ReaderLock() ABSL_UNLOCK_FUNCTION() {}
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

  void Lock() ABSL_SHARED_LOCK_FUNCTION() { lock_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }

 private:
  std::shared_lock<std::shared_mutex> lock_;
};

// Holds a SharedMutex exclusively for its scope.
class ABSL_SCOPED_LOCKABLE WriterLock {
 public:
  explicit WriterLock(SharedMutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu.mu_) {}
  ~WriterLock() ABSL_UNLOCK_FUNCTION() {}
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }

 private:
  std::unique_lock<std::shared_mutex> lock_;
};

}  // namespace strata
