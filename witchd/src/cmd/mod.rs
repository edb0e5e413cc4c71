//! One module per subcommand of `witch`.

pub mod attach;
pub mod daemon;
pub mod diff;
pub mod doctor;
pub mod exact;
pub mod gate;
pub mod generate;
pub mod launch;
pub mod output;
pub mod report;
pub mod run;
