//! Stage markers are sealed: no stage can be added outside the crate.
use taskstage::typestate::stages::StageMarker;
use taskstage::Stage;

enum Sleeping {}

impl StageMarker for Sleeping {
    const STAGE: Stage = Stage::Paused;
}

fn main() {}
