// The CUDA backend: NVIDIA GPUs through the CUDA runtime (libcudart) for
// memory, copies, streams and events, and the driver (libcuda) for virtual
// memory management (cuMemAddressReserve / cuMemCreate / cuMemMap /
// cuMemSetAccess), both opened with dlopen at run time. See
// include/u3m/mem/backend_accel.hpp for what the backend does and
// docs/accelerators.md for what has run on hardware.
#pragma once

#include <memory>
#include <string>

#include "u3m/mem/backend_accel.hpp"

namespace u3m::mem {

struct CudaOptions {
  int device = 0;
  // A path or soname; empty: $U3M_CUDART_LIBRARY, else libcudart.so,
  // libcudart.so.13/.12/.11.0, $CUDA_HOME/lib64 and /usr/local/cuda/lib64.
  std::string runtime_library;
  // Empty: $U3M_CUDA_DRIVER_LIBRARY, else libcuda.so.1, libcuda.so. Without
  // it the backend works, with vmm = false.
  std::string driver_library;
};

// Loads CUDA and probes the device. On failure *out is untouched and `why`
// is one line saying what is missing ("no CUDA runtime library found: ...",
// "cudaGetDeviceCount: 35 cudaErrorInsufficientDriver ...").
Status open_cuda_backend(const CudaOptions& options, std::unique_ptr<AccelBackend>* out,
                         std::string* why);

}  // namespace u3m::mem
