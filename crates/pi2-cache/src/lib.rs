//! pi2-cache: the segmented neuron cache (fixed, predictor, hot and cold regions under one byte
//! budget, an eviction policy behind a trait, hit statistics).
//!
//! Empty until the flash-offload work: the dense engine keeps every weight in the model mapping.
