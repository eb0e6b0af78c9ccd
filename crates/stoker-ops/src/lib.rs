//! `stoker-ops`: preprocessing kernels, pure functions over [`stoker_core::Value`]s.
//!
//! Each module holds the kernels of one modality. Random kernels take their randomness
//! from a [`stoker_core::rng::Rng`] the caller hands in (the pipeline's per-sample
//! generator), so results are reproducible under any parallelism and across resume.
//! Wiring the kernels into pipelines (operator names, spec keys, fusion) is
//! `stoker-pipeline`'s job.

pub mod audio;
pub mod image;
pub mod tabular;
pub mod text;
