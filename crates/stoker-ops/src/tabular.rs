//! Tabular kernels.
