// The control API (double_control.h), the same in both doubles: each shim
// defines device() with its own codes.
#include "double_control.h"

#include "fake_device.hpp"

#define U3M_EXPORT extern "C" __attribute__((visibility("default")))

using u3m::doubles::device;

U3M_EXPORT void u3m_double_reset(void) {
  device().reset();
}
U3M_EXPORT void u3m_double_configure(int device_count, uint64_t capacity, uint64_t granularity) {
  device().configure(device_count, capacity, granularity);
}
U3M_EXPORT void u3m_double_fail_next(const char* api, int code, int times) {
  device().fail_next(api, code, times);
}
U3M_EXPORT void u3m_double_fail_next_copy(int code, int sticky) {
  device().fail_next_copy(code, sticky != 0);
}
U3M_EXPORT void u3m_double_hold(int on) {
  device().hold(on != 0);
}
U3M_EXPORT uint64_t u3m_double_calls(const char* api) {
  return device().calls(api);
}
U3M_EXPORT uint64_t u3m_double_live_objects(void) {
  return device().live_objects();
}
