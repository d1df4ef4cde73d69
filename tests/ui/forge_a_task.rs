//! A typed task cannot be made from a handle by hand: only the API types it, from a
//! stage the core really reached.
use std::marker::PhantomData;

use taskstage::typestate::stages::Running;
use taskstage::{Handle, Task};

fn forge(handle: Handle) -> Task<Running> {
    Task { handle, stage: PhantomData }
}

fn main() {
    let _ = forge;
}
