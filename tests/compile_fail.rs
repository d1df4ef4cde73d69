//! Compile-fail proofs of the typestate API: each case in `tests/ui/` issues a command
//! that the transition table refuses in the task's stage (or misuses a task), and must
//! fail to compile with exactly the error saved beside it in a `.stderr` file.
//!
//! Regenerate the `.stderr` files after a deliberate change with
//! `TRYBUILD=overwrite cargo test --test compile_fail`, then read them: each must fail
//! for the reason its case names.
//!
//! The saved errors are those of the default features: with `etcd` on, the compiler
//! also names a similarly named trait of `tonic`, so the file is compiled out there
//! and `scripts/test-all.sh` runs it with the default features.
#![allow(
    clippy::incompatible_msrv,
    reason = "built on the toolchain CI uses; rust-version is the library's minimum"
)]
// The compiler's error text depends on which crates are linked (see above).
#![cfg(not(feature = "etcd"))]

#[test]
fn invalid_typestate_commands_do_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
