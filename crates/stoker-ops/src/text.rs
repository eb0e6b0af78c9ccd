//! Text kernels.
