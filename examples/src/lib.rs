//! The code of taskstage's examples that their tests drive as well: the migration on
//! SQLite (`migrate`) and the graceful shutdown of a group (`shutdown`). Each example
//! in `examples/` is a `main` over one of these modules; see `docs/migrate.md`.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

pub mod migrate;
pub mod shutdown;
