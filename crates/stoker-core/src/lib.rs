//! `stoker-core`: what every Stoker crate shares.
//!
//! Today that is the [`MemoryBudget`] (one byte budget for caches, read-ahead and queues, so
//! memory use has a hard ceiling and pressure turns into backpressure rather than an OOM kill)
//! and [`ByteSize`] (human sizes such as `8MiB` in every option, flag and spec file). The data
//! model (`Value`, `Tensor`, `Sample`, `Batch`) and operator metadata join it with the pipeline
//! engine.
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
mod size;

pub use budget::{system_memory_bytes, MemoryBudget, Reservation};
pub use size::{ByteSize, ParseSizeError};
