//! The exact reference mode: every memory access of the program, observed by
//! single-stepping it under ptrace, judged with the same definitions the
//! crafts sample (the exhaustive tools' metrics), and written in the same
//! profile format so `report`, `diff` and `gate` work on it.
//!
//! The definitions, the shadow memory and the shadow call stack are the
//! judge's ([`judge`]), which the code-cache exact mode shares.
//!
//! Like the crafts, judgements are per thread (debug registers are). The
//! calling context of each access comes from a shadow call stack kept by
//! watching `call` and `ret` execute, so no unwinding is needed. It is slow
//! (one ptrace stop per instruction): a reference, not the product.
//!
//! The program's side of the code-cache mode, the threads' rings
//! ([`ring`]) and the notices' format ([`stream`]), is all the agent
//! needs and all that is built without the `controller` feature; the
//! rest (the judge, the replay of records, the reader of the rings, and
//! the single-step mode with its ptrace) is witch's.

#[cfg(feature = "controller")]
mod judge;
#[cfg(feature = "controller")]
mod judges;
#[cfg(feature = "controller")]
mod output;
#[cfg(feature = "controller")]
mod reader;
#[cfg(feature = "controller")]
mod replay;
pub mod ring;
#[cfg(feature = "controller")]
mod shadow;
#[cfg(feature = "controller")]
mod step;
pub mod stream;
#[cfg(feature = "controller")]
mod string;

#[cfg(feature = "controller")]
pub use judge::{Observed, ThreadShadow, WIDE};
#[cfg(feature = "controller")]
pub use judges::{default_count as default_judges, Judgements, Judges};
#[cfg(feature = "controller")]
pub use output::{exact_sampler, thread_profiles};
#[cfg(feature = "controller")]
pub use reader::{Judge, JudgedImage};
#[cfg(feature = "controller")]
pub use replay::Replay;
#[cfg(feature = "controller")]
pub use step::{Exact, ExactRun};
