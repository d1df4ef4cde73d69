//! Compile-fail proofs of the typestate API: each case in `tests/ui/` issues a command
//! that the transition table refuses in the task's stage (or misuses a task), and must
//! fail to compile with exactly the error saved beside it in a `.stderr` file.
//!
//! Regenerate the `.stderr` files after a deliberate change with
//! `TRYBUILD=overwrite cargo test --test compile_fail`, then read them: each must fail
//! for the reason its case names.
//!
//! The core links no network crate (the cluster's etcd backend, whose `tonic` has a
//! trait of a similar name that the compiler would suggest, lives in a crate of its
//! own), so the saved errors are the same with every feature of this crate.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]

#[test]
fn invalid_typestate_commands_do_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
