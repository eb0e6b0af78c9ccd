//! Image kernels.
