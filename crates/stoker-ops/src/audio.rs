//! Audio kernels.
