//! `stoker-core`: what every Stoker crate shares.
//!
//! - The data model: a [`Sample`] is a record of named fields, each a [`Value`] (bytes,
//!   [`Tensor`], text, integer, float, list); a [`Batch`] holds each field stacked across
//!   samples under a [`CollatePolicy`].
//! - [`Error`]: what went wrong and where (object, byte offset, record, operator).
//! - [`OpMeta`]: what an operator declares about itself for the optimizer.
//! - The [`MemoryBudget`]: one byte budget for caches, read-ahead and queues, so memory use
//!   has a hard ceiling and pressure turns into backpressure rather than an OOM kill; and
//!   [`ByteSize`] (human sizes such as `8MiB` in every option, flag and spec file).
//! - [`rng`]: counter-based randomness, so every random draw is a pure function of the
//!   seed and a position, whatever the parallelism.
//!
//! ```
//! use stoker_core::{ByteSize, MemoryBudget};
//! let budget = MemoryBudget::new("64MiB".parse::<ByteSize>().unwrap().bytes());
//! let held = budget.try_reserve(8 << 20).unwrap();
//! assert_eq!(budget.used(), 8 << 20);
//! drop(held);
//! assert_eq!(budget.used(), 0);
//! ```

mod budget;
mod error;
mod op;
pub mod recycle;
pub mod rng;
mod sample;
mod size;
pub mod slots;
mod tensor;
pub mod trace;

pub use budget::{system_memory_bytes, MemoryBudget, Reservation};
pub use error::{panic_message, Cause, Error, ErrorKind};
pub use op::OpMeta;
pub use sample::{Batch, Collate, CollatePolicy, Column, Columns, Sample, Stacker, Value};
pub use size::{ByteSize, ParseSizeError};
pub use slots::{BatchSlots, Lease};
pub use tensor::{DType, Element, Tensor};
