//! pi2-io: the flash reader (aligned buffers, O_DIRECT with a buffered fallback, request
//! coalescing, one submission queue at the device's preferred depth, device profiling).
//! It knows nothing about tensors.
//!
//! Empty until the flash-offload work: the dense engine reads weights through the model mapping.
