/* The control API both test doubles export next to the C API they fake
 * (fake_device.hpp). Tests reach it with dlsym on the same library the
 * backend loaded, so they steer the very instance under test. */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Forgets everything: memory, handles, counters, injections; one device,
 * 1 GiB, 2 MiB granularity. */
void u3m_double_reset(void);
/* device_count 0 makes the device-count query report none. */
void u3m_double_configure(int device_count, uint64_t capacity, uint64_t granularity);
/* The next `times` calls of the API function `api` (its exact name, e.g.
 * "cudaMalloc", "aclrtMapMem") fail with `code` before doing anything. */
void u3m_double_fail_next(const char* api, int code, int times);
/* The next async copy a stream runs fails with `code`, reported at the
 * stream's synchronize; sticky: the device is lost, every later call fails
 * with `code` (CUDA's sticky errors, a lost Ascend device). */
void u3m_double_fail_next_copy(int code, int sticky);
/* 1: every stream stops before its next op; 0: they go on. */
void u3m_double_hold(int on);
/* How many times `api` was called since the last reset. */
uint64_t u3m_double_calls(const char* api);
/* Allocations, host buffers, registrations, reservations, chunks, streams
 * (not the implicit default one) and events still alive: 0 after a backend
 * has cleaned up. */
uint64_t u3m_double_live_objects(void);

#ifdef __cplusplus
}
#endif
